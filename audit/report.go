package audit

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is an audit's outcome ("outboxd audit --json" prints it).
type Report struct {
	// Clean is true when no verdict was found (Verdicts is empty).
	Clean bool `json:"clean"`
	// Verdicts name what was found, e.g. "orders: 3 missing".
	Verdicts []string `json:"verdicts"`
	// From and To are the ids of the rows audited (To < From: none).
	From int64 `json:"from_id"`
	To   int64 `json:"to_id"`
	// Since and Until are the time range asked for (by time only).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// TableMin is the lowest id still in the table; records below it
	// have no row to compare with (TableEmpty: no row at all).
	TableMin   int64 `json:"table_min_id"`
	TableEmpty bool  `json:"table_empty"`
	// ContentChecked says whether mismatches were looked for (the default
	// record shape only).
	ContentChecked bool `json:"content_checked"`
	// DuplicatesAllowed is set by the caller that passes duplicates
	// (at-least-once delivery makes them): the text then says so instead
	// of NOT CLEAN when they are the only verdict.
	DuplicatesAllowed bool          `json:"duplicates_allowed,omitempty"`
	Topics            []TopicReport `json:"topics"`
	Started           time.Time     `json:"started"`
	Elapsed           string        `json:"elapsed"`

	// missing are the missing ids as ranges of consecutive ids, in id
	// order, for a repair (16 bytes a range: an outage's gap is one).
	missing [][2]int64
}

// MissingRanges are the ids missing from Kafka, all topics, as inclusive
// ranges of consecutive ids in id order.
func (r *Report) MissingRanges() [][2]int64 { return r.missing }

// MissingCount is the number of rows missing from Kafka, all topics.
func (r *Report) MissingCount() int64 {
	var n int64
	for i := range r.Topics {
		n += r.Topics[i].Missing.Count
	}
	return n
}

// CleanIgnoring reports whether the audit found nothing but, when
// allowDuplicates, duplicates (at-least-once delivery allows them).
func (r *Report) CleanIgnoring(allowDuplicates bool) bool {
	if r.Clean || !allowDuplicates {
		return r.Clean
	}
	for i := range r.Topics {
		t := &r.Topics[i]
		if t.Missing.Count+t.Reorders.Count+t.Mismatches.Count+t.Unknown.Count > 0 {
			return false
		}
	}
	return true
}

// addMissing notes id (ids come in increasing order) in the ranges.
func (r *Report) addMissing(id int64) {
	if n := len(r.missing); n > 0 && r.missing[n-1][1] == id-1 {
		r.missing[n-1][1] = id
		return
	}
	r.missing = append(r.missing, [2]int64{id, id})
}

// TopicReport is one topic's counts. A verdict is attributed to the topic
// of its row (missing, mismatch) or of its record (the others).
type TopicReport struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	// HighWatermarks are the offsets read up to, noted at the start, by
	// partition.
	HighWatermarks []int64 `json:"high_watermarks"`
	// Rows is the number of rows of the range with this topic; Records the
	// records read whose outbox-id is in the range (all copies).
	Rows    int64 `json:"rows"`
	Records int64 `json:"records"`
	// Foreign counts records without an outbox-id header that parses as an
	// id (other producers of the topic), ignored otherwise.
	Foreign               int64   `json:"foreign_records"`
	Missing               Verdict `json:"missing"`
	DuplicatesSameOrigin  Verdict `json:"duplicates_same_origin"`
	DuplicatesOtherOrigin Verdict `json:"duplicates_other_origin"`
	Reorders              Verdict `json:"reorders"`
	Mismatches            Verdict `json:"mismatches"`
	// Retained are the ids of records below the lowest row: delivered,
	// not checkable (retention deleted their rows). Not a verdict.
	Retained Verdict `json:"retained"`
	// RetainedDuplicates are further copies among them (where they cannot
	// be told apart — more ids than a bit each for MaxIDs × 8, or an empty
	// table — every copy counts in Retained).
	RetainedDuplicates int64 `json:"retained_duplicates"`
	// Unknown are records with no row at or above the lowest one.
	Unknown Verdict `json:"unknown_origin"`
}

// Verdict is a count and the first ids it counted.
type Verdict struct {
	Count int64   `json:"count"`
	IDs   []int64 `json:"ids,omitempty"`
}

func (v *Verdict) add(id int64, examples int) {
	v.Count++
	v.addExample(id, examples)
}

func (v *Verdict) addExample(id int64, examples int) {
	if len(v.IDs) < examples {
		v.IDs = append(v.IDs, id)
	}
}

// Duplicates is the total of both kinds.
func (t *TopicReport) Duplicates() int64 {
	return t.DuplicatesSameOrigin.Count + t.DuplicatesOtherOrigin.Count
}

// summarise fills Verdicts and Clean.
func (r *Report) summarise() {
	r.Verdicts = []string{}
	for i := range r.Topics {
		t := &r.Topics[i]
		for _, v := range []*Verdict{&t.Missing, &t.DuplicatesSameOrigin, &t.DuplicatesOtherOrigin,
			&t.Reorders, &t.Mismatches, &t.Retained, &t.Unknown} {
			slices.Sort(v.IDs)
		}
		for _, v := range []struct {
			n    int64
			what string
		}{
			{t.Missing.Count, "missing from Kafka"},
			{t.DuplicatesSameOrigin.Count, "duplicates (same origin)"},
			{t.DuplicatesOtherOrigin.Count, "duplicates (other origin)"},
			{t.Reorders.Count, "first deliveries out of id order per key"},
			{t.Mismatches.Count, "mismatches (key, value, headers or topic differ from the row)"},
			{t.Unknown.Count, "records with no row at or above the lowest row (unknown origin)"},
		} {
			if v.n > 0 {
				r.Verdicts = append(r.Verdicts, fmt.Sprintf("%s: %d %s", t.Topic, v.n, v.what))
			}
		}
	}
	r.Clean = len(r.Verdicts) == 0
}

// WriteText prints the report as a table for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	switch {
	case r.To < r.From:
		b.WriteString("audit: no rows in range")
	default:
		fmt.Fprintf(&b, "audit: rows with ids %d to %d", r.From, r.To)
	}
	if !r.Since.IsZero() {
		fmt.Fprintf(&b, " (created_at from %s", r.Since.Format(time.RFC3339))
		if !r.Until.IsZero() {
			fmt.Fprintf(&b, " to %s", r.Until.Format(time.RFC3339))
		}
		b.WriteString(")")
	}
	if r.TableEmpty {
		b.WriteString("; the table is empty")
	} else {
		fmt.Fprintf(&b, "; lowest id in the table %d", r.TableMin)
	}
	fmt.Fprintf(&b, "; Kafka read_committed up to the high watermarks of %s; %s\n", r.Started.Format(time.RFC3339), r.Elapsed)
	if !r.ContentChecked {
		b.WriteString("mismatch checking is off: the record format is not outboxd's default (raw JSON), so records cannot be rebuilt from rows here\n")
	}
	b.WriteString("dup-same/dup-other: further copies of an id with the same / another outbox-origin; retained: ids below the lowest row (no row to check, not a verdict); unknown: records with no row at or above it; foreign: records without an outbox-id\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "topic\tpartitions\trows\trecords\tmissing\tdup-same\tdup-other\treordered\tmismatched\tretained\tunknown\tforeign\t")
	for _, t := range r.Topics {
		mm := strconv.FormatInt(t.Mismatches.Count, 10)
		if !r.ContentChecked {
			mm = "off"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t\n", t.Topic, t.Partitions, t.Rows, t.Records,
			t.Missing.Count, t.DuplicatesSameOrigin.Count, t.DuplicatesOtherOrigin.Count, t.Reorders.Count, mm,
			t.Retained.Count, t.Unknown.Count, t.Foreign)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.Reset()
	for _, t := range r.Topics {
		for _, v := range []struct {
			what string
			v    Verdict
		}{
			{"missing", t.Missing}, {"duplicated (same origin)", t.DuplicatesSameOrigin},
			{"duplicated (other origin)", t.DuplicatesOtherOrigin}, {"reordered", t.Reorders},
			{"mismatched", t.Mismatches}, {"unknown origin", t.Unknown},
		} {
			if v.v.Count > 0 {
				fmt.Fprintf(&b, "%s: %s: %s\n", t.Topic, v.what, ids(v.v))
			}
		}
		if t.Retained.Count > 0 {
			fmt.Fprintf(&b, "%s: retained: %s below the lowest row (further copies: %d): proven delivered, not checked against a row (retention deleted it)\n",
				t.Topic, ids(t.Retained), t.RetainedDuplicates)
		}
	}
	if r.Clean {
		b.WriteString("clean: every row in range is in Kafka once, in order per key")
		if r.ContentChecked {
			b.WriteString(", as outboxd would build it")
		}
		b.WriteString("\n")
	} else if r.DuplicatesAllowed && r.CleanIgnoring(true) {
		fmt.Fprintf(&b, "clean but for duplicates, which at-least-once delivery allows (%s): every row in range is in Kafka, in order per key", strings.Join(r.Verdicts, "; "))
		if r.ContentChecked {
			b.WriteString(", as outboxd would build it")
		}
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "NOT CLEAN: %s\n", strings.Join(r.Verdicts, "; "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ids is a verdict's listed ids, with "…" when it counted more.
func ids(v Verdict) string {
	s := make([]string, len(v.IDs))
	for i, id := range v.IDs {
		s[i] = strconv.FormatInt(id, 10)
	}
	out := "ids " + strings.Join(s, ", ")
	if int64(len(v.IDs)) < v.Count {
		out += fmt.Sprintf(" … (%d in all)", v.Count)
	}
	return out
}
