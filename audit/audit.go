package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// Config says what to audit and how.
type Config struct {
	// Schema and Table name the outbox table (outboxd's shape:
	// migrations/001_outbox.sql; headers, created_at and event_type are
	// optional).
	Schema, Table string
	// Mapping is how outboxd builds records (DefaultTopic for rows without
	// a topic, the id and key headers, the encodings).
	Mapping outbox.Mapping
	// CheckContent compares each record's key, value and headers with the
	// row's; set it only for the default record shape (the package doc).
	CheckContent bool
	// FromID and ToID (0: the highest id in the table) select rows by id;
	// else Since and Until (zero: now) select them by created_at.
	FromID, ToID int64
	Since, Until time.Time
	// Topics are read besides the topics of the rows in range (a topic
	// whose rows retention deleted).
	Topics []string
	// FromOffsetTime, when set, starts each partition at the first record
	// whose timestamp is at or after it (outboxd's record timestamp is the
	// row's created_at) instead of at the partition's start.
	FromOffsetTime time.Time
	// StableTimeout bounds the wait for a partition's last stable offset to
	// reach the high watermark noted at the start, and each fetch after it.
	StableTimeout time.Duration
	// Examples is how many ids each verdict lists per topic.
	Examples int
	// MaxIDs is the widest id range audited at once (its entries: the
	// package doc).
	MaxIDs int64
}

// DefaultConfig returns the defaults of "outboxd audit".
func DefaultConfig() Config {
	return Config{Schema: "public", Table: "outbox", Mapping: outbox.DefaultMapping(), CheckContent: true,
		StableTimeout: 2 * time.Minute, Examples: 10, MaxIDs: 200_000_000}
}

// Validate reports every invalid field at once.
func (c *Config) Validate() error {
	var errs []error
	byID, byTime := c.FromID != 0 || c.ToID != 0, !c.Since.IsZero() || !c.Until.IsZero()
	switch {
	case byID && byTime:
		errs = append(errs, errors.New("select rows by id (--from-id, --to-id) or by time (--since, --until), not both"))
	case !byID && !byTime:
		errs = append(errs, errors.New("select the rows to audit: --from-id N [--to-id M] or --since T [--until U]"))
	case byID && (c.FromID < 0 || c.ToID < 0):
		errs = append(errs, errors.New("--from-id and --to-id must be ≥ 0"))
	case byID && c.ToID != 0 && c.ToID < c.FromID:
		errs = append(errs, fmt.Errorf("--to-id %d is below --from-id %d", c.ToID, c.FromID))
	case byTime && c.Since.IsZero():
		errs = append(errs, errors.New("--until needs --since"))
	case byTime && !c.Until.IsZero() && !c.Until.After(c.Since):
		errs = append(errs, fmt.Errorf("--until %s is not after --since %s", c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339)))
	}
	if c.StableTimeout <= 0 {
		errs = append(errs, errors.New("--stable-timeout must be > 0"))
	}
	if c.Examples < 0 {
		errs = append(errs, errors.New("--examples must be ≥ 0"))
	}
	if c.Schema == "" || c.Table == "" {
		errs = append(errs, errors.New("no outbox table named: set --schema and --table"))
	}
	return errors.Join(errs...)
}

func (c *Config) byID() bool { return c.FromID != 0 || c.ToID != 0 }

// entry is what the audit holds per id of the range: fixed size, no payload
// (32 bytes; the package doc's formula).
type entry struct {
	hash      uint64 // of the first delivery's key, value and headers
	offset    int64  // of the first delivery
	partition int32
	count     uint32 // deliveries
	origin    uint32 // hash of the first delivery's outbox-origin header
	topic     uint16 // index in auditor.topics
	flags     uint8
}

const (
	// flagDiffers: a later delivery's content differs from the first's.
	flagDiffers uint8 = 1 << iota
	// flagRow: the id's row was read.
	flagRow
	// flagOtherTopic: delivered to more than one topic.
	flagOtherTopic
)

// auditor is one audit's state.
type auditor struct {
	cfg    Config
	seed   maphash.Seed
	topics []string
	stats  []*TopicReport // by topic index
	byName map[string]uint16

	// The rows' id range: entries[id-lo] for lo ≤ id ≤ hi.
	lo, hi  int64
	entries []entry
	// tableMin is the lowest id still in the table (none: the table is
	// empty, every record is below it).
	tableMin int64
	noRows   bool
	// retainedSeen has a bit per id from retainedBase to tableMin:
	// records with no row below the lowest one, counted once per id.
	retainedSeen []uint64
	retainedBase int64 // the id of retainedSeen's first bit
	rep          *Report
}

// Run audits cfg's range: conn reads the table, kcfg reaches Kafka.
func Run(ctx context.Context, conn *pgx.Conn, kcfg kafka.Config, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &auditor{cfg: cfg, seed: maphash.MakeSeed(), byName: map[string]uint16{}}
	// One snapshot for every read of the table, taken before the high
	// watermarks are noted: the rows judged are those committed then, and a
	// row retention deletes meanwhile is still read (and checked) rather
	// than leaving its record without a row. It holds back vacuum for as
	// long as the audit reads.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("audit: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // read only: nothing to keep
	tbl, err := inspect(ctx, tx, cfg)
	if err != nil {
		return nil, err
	}
	if err := a.bounds(ctx, tx, tbl); err != nil {
		return nil, err
	}
	topics, err := a.rowTopics(ctx, tx, tbl)
	if err != nil {
		return nil, err
	}
	for _, t := range append(append(topics, cfg.Topics...), cfg.Mapping.DefaultTopic) {
		if t != "" {
			a.topic(t)
		}
	}
	rep := &Report{From: a.lo, To: a.hi, TableMin: a.tableMin, TableEmpty: a.noRows,
		ContentChecked: cfg.CheckContent, Started: time.Now().UTC()}
	if !cfg.byID() {
		rep.Since, rep.Until = cfg.Since, cfg.Until
	}
	a.rep = rep
	if err := a.readKafka(ctx, kcfg); err != nil {
		return nil, err
	}
	if err := a.readRows(ctx, tx, tbl); err != nil {
		return nil, err
	}
	a.noRowRecords()
	for _, s := range a.stats {
		rep.Topics = append(rep.Topics, *s)
	}
	slices.SortFunc(rep.Topics, func(x, y TopicReport) int {
		switch {
		case x.Topic < y.Topic:
			return -1
		case x.Topic > y.Topic:
			return 1
		}
		return 0
	})
	rep.Elapsed = time.Since(rep.Started).Round(time.Millisecond).String()
	rep.summarise()
	return rep, nil
}

// topic is the index of topic t, added when new.
func (a *auditor) topic(t string) uint16 {
	if i, ok := a.byName[t]; ok {
		return i
	}
	i := uint16(len(a.topics))
	a.topics = append(a.topics, t)
	a.stats = append(a.stats, &TopicReport{Topic: t})
	a.byName[t] = i
	return i
}

// bounds reads the table's lowest id and the range's ids, and sizes the
// entries.
func (a *auditor) bounds(ctx context.Context, conn pgx.Tx, tbl *table) error {
	var tmin, tmax *int64
	if err := conn.QueryRow(ctx, `SELECT min(id)::int8, max(id)::int8 FROM `+tbl.name).Scan(&tmin, &tmax); err != nil {
		return fmt.Errorf("audit: read the ids of %s: %w", tbl.plain, err)
	}
	a.noRows = tmin == nil
	if a.noRows {
		// An empty table: every record in range is below its lowest row.
		a.tableMin = a.cfg.ToID + 1
		if !a.cfg.byID() || a.cfg.ToID == 0 {
			a.tableMin = 1<<63 - 1
		}
		a.lo, a.hi = 1, 0
		return a.sizeRetained()
	}
	a.tableMin = *tmin
	if a.cfg.byID() {
		a.lo, a.hi = max(a.cfg.FromID, *tmin), *tmax
		if a.cfg.ToID != 0 {
			a.hi = min(a.cfg.ToID, *tmax)
		}
	} else {
		var lo, hi *int64
		if err := conn.QueryRow(ctx, `SELECT min(id)::int8, max(id)::int8 FROM `+tbl.name+` WHERE `+tbl.timeWhere(1),
			a.cfg.Since, nullTime(a.cfg.Until)).Scan(&lo, &hi); err != nil {
			return fmt.Errorf("audit: read the ids of %s in the time range: %w", tbl.plain, err)
		}
		if lo == nil {
			a.lo, a.hi = 1, 0
		} else {
			a.lo, a.hi = *lo, *hi
		}
	}
	if n := a.hi - a.lo + 1; n > a.cfg.MaxIDs {
		return fmt.Errorf("audit: ids %d to %d are %d ids, more than the %d audited at once (32 bytes each): narrow the range", a.lo, a.hi, n, a.cfg.MaxIDs)
	}
	if a.hi >= a.lo {
		a.entries = make([]entry, a.hi-a.lo+1)
	}
	return a.sizeRetained()
}

// sizeRetained makes the bitmap of ids below the lowest row: from FromID
// (by time: from 1, ids of a sequence) to it.
func (a *auditor) sizeRetained() error {
	a.retainedBase = a.cfg.FromID
	if !a.cfg.byID() {
		a.retainedBase = 1
	}
	if a.tableMin <= a.retainedBase || (a.noRows && a.cfg.ToID == 0) {
		return nil // records below the lowest row are counted, not told apart
	}
	top := a.tableMin
	if a.cfg.ToID != 0 {
		top = min(top, a.cfg.ToID+1)
	}
	n := top - a.retainedBase
	if n > 8*a.cfg.MaxIDs {
		if !a.cfg.byID() {
			return nil // too many to tell apart: counted
		}
		return fmt.Errorf("audit: ids %d to %d lie below the lowest row (%d) and are too many to count one bit each: start --from-id nearer to it", a.cfg.FromID, top-1, a.tableMin)
	}
	a.retainedSeen = make([]uint64, (n+63)/64)
	return nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// record is one record read from Kafka, as the index needs it.
type record struct {
	topic     uint16
	partition int32
	offset    int64
	timestamp time.Time
	id        int64
	hash      uint64
	origin    uint32
	keyHash   uint64
}

// add indexes one committed record; firstDelivery reports whether it is its
// id's first (for the order check).
func (a *auditor) add(r *record) (firstDelivery bool) {
	st := a.stats[r.topic]
	switch {
	case r.id >= a.lo && r.id <= a.hi:
		e := &a.entries[r.id-a.lo]
		st.Records++
		if e.count == 0 {
			*e = entry{hash: r.hash, offset: r.offset, partition: r.partition, count: 1, origin: r.origin, topic: r.topic}
			return true
		}
		e.count++
		if e.hash != r.hash {
			e.flags |= flagDiffers
		}
		if e.topic != r.topic {
			e.flags |= flagOtherTopic
		}
		if e.origin == r.origin {
			st.DuplicatesSameOrigin.add(r.id, a.cfg.Examples)
		} else {
			st.DuplicatesOtherOrigin.add(r.id, a.cfg.Examples)
		}
		return false
	case r.id < a.tableMin && a.inScopeBelow(r):
		st.Records++
		i := r.id - a.retainedBase
		if i < 0 || i/64 >= int64(len(a.retainedSeen)) {
			// Not told apart from its copies: counted, and left out of
			// the order check (a copy is not a first delivery).
			st.Retained.add(r.id, a.cfg.Examples)
			return false
		}
		if a.retainedSeen[i/64]&(1<<(i%64)) != 0 {
			st.RetainedDuplicates++
			return false
		}
		a.retainedSeen[i/64] |= 1 << (i % 64)
		st.Retained.add(r.id, a.cfg.Examples)
		return true
	case a.inScopeAbove(r):
		// Above the highest row of an id range that reaches past it: no
		// row wrote it (yet): its origin is unknown.
		st.Records++
		st.Unknown.add(r.id, a.cfg.Examples)
		return true
	}
	return false // outside the range audited
}

// inScopeBelow reports whether r, below the lowest row, is in the range.
func (a *auditor) inScopeBelow(r *record) bool {
	if a.cfg.byID() {
		return r.id >= a.cfg.FromID && (a.cfg.ToID == 0 || r.id <= a.cfg.ToID)
	}
	// By time, the record's timestamp stands for the deleted row's
	// created_at (outboxd's record timestamp).
	return !r.timestamp.Before(a.cfg.Since) && (a.cfg.Until.IsZero() || r.timestamp.Before(a.cfg.Until))
}

// inScopeAbove reports whether r, above the range's rows, is in the range.
func (a *auditor) inScopeAbove(r *record) bool {
	if !a.cfg.byID() || a.noRows || r.id <= a.hi {
		return false
	}
	return a.cfg.ToID == 0 || r.id <= a.cfg.ToID
}

// noRowRecords reports the entries no row claimed: ids inside the rows'
// range without a row (in the audit's snapshot), of unknown origin.
func (a *auditor) noRowRecords() {
	for i := range a.entries {
		e := &a.entries[i]
		if e.count > 0 && e.flags&flagRow == 0 {
			a.stats[e.topic].Unknown.add(a.lo+int64(i), a.cfg.Examples)
		}
	}
}
