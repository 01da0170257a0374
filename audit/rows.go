package audit

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// table is what the audit learned about the outbox table.
type table struct {
	name, plain string // quoted schema.table for SQL; as typed, for messages
	selectSQL   string // SELECT <an Event's columns> FROM <table>
	hasTopic    bool
	hasCreated  bool
}

// inspect reads the table's columns and builds the row query. Each value is
// selected in the form the pgoutput decoder sees it (text output; a bytea
// payload raw), so that outbox.NewRecord builds the record outboxd built.
func inspect(ctx context.Context, conn pgx.Tx, cfg Config) (*table, error) {
	t := &table{name: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), plain: cfg.Schema + "." + cfg.Table}
	rows, err := conn.Query(ctx, `
		SELECT a.attname, t.typname
		  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, t.name)
	if err != nil {
		return nil, fmt.Errorf("audit: read the columns of %s: %w", t.plain, err)
	}
	types, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var c [2]string
		return c, r.Scan(&c[0], &c[1])
	})
	if err != nil {
		return nil, fmt.Errorf("audit: read the columns of %s: %w", t.plain, err)
	}
	typ := map[string]string{}
	for _, c := range types {
		typ[c[0]] = c[1]
	}
	if len(typ) == 0 {
		return nil, fmt.Errorf("audit: outbox table %s does not exist (set --schema and --table)", t.plain)
	}
	for _, col := range []string{"id", "aggregate_id", "payload"} {
		if typ[col] == "" {
			return nil, fmt.Errorf("audit: outbox table %s has no column %q: the audit reads outboxd's table shape (migrations/001_outbox.sql)", t.plain, col)
		}
	}
	switch typ["id"] {
	case "int2", "int4", "int8":
	default:
		return nil, fmt.Errorf("audit: outbox table %s: column \"id\" has type %s; the audit indexes integer ids only", t.plain, typ["id"])
	}
	id := func(col string) string { return pgx.Identifier{col}.Sanitize() }
	sel := []string{id("id") + "::int8", id("aggregate_id") + "::text"}
	if typ["payload"] == "bytea" {
		sel = append(sel, id("payload"))
	} else {
		sel = append(sel, id("payload")+"::text")
	}
	opt := func(col string) {
		if typ[col] != "" {
			sel = append(sel, id(col)+"::text")
		} else {
			sel = append(sel, "NULL::text")
		}
	}
	t.hasTopic = typ["topic"] != ""
	if !t.hasTopic && cfg.Mapping.DefaultTopic == "" {
		return nil, fmt.Errorf("audit: outbox table %s has no column \"topic\": set --default-topic", t.plain)
	}
	opt("topic")
	opt("event_type")
	opt("headers")
	switch typ["created_at"] {
	case "timestamptz", "timestamp":
		t.hasCreated = true
	case "":
		if !cfg.byID() {
			return nil, fmt.Errorf("audit: outbox table %s has no column \"created_at\": select rows by --from-id instead of --since", t.plain)
		}
	default:
		return nil, fmt.Errorf("audit: outbox table %s: column \"created_at\" has type %s, want timestamptz or timestamp", t.plain, typ["created_at"])
	}
	t.selectSQL = "SELECT " + strings.Join(sel, ", ") + " FROM " + t.name
	return t, nil
}

// timeWhere is the condition of rows created from $n to $n+1 (NULL: no
// end); a timestamp without time zone is taken as UTC, as the decoder does.
func (t *table) timeWhere(n int) string {
	col := pgx.Identifier{"created_at"}.Sanitize()
	return fmt.Sprintf("%s >= $%d AND ($%d::timestamptz IS NULL OR %s < $%d)", col, n, n+1, col, n+1)
}

// rowTopics are the distinct topics of the rows in range (the default topic
// for a NULL one).
func (a *auditor) rowTopics(ctx context.Context, conn pgx.Tx, tbl *table) ([]string, error) {
	if !tbl.hasTopic || a.hi < a.lo {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `SELECT DISTINCT coalesce(`+pgx.Identifier{"topic"}.Sanitize()+`::text, $3) FROM `+tbl.name+
		` WHERE id >= $1 AND id <= $2`, a.lo, a.hi, a.cfg.Mapping.DefaultTopic)
	if err != nil {
		return nil, fmt.Errorf("audit: read the topics of %s: %w", tbl.plain, err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("audit: read the topics of %s: %w", tbl.plain, err)
	}
	return topics, nil
}

// readRows reads the rows of the id range in id order and judges each
// against its entry. Every row of the id range is read, also by time: a
// row's created_at is its transaction's start, not its id's order, so rows
// just outside the time range can sit between ids inside it, and their
// records would otherwise count as having no row.
func (a *auditor) readRows(ctx context.Context, conn pgx.Tx, tbl *table) error {
	if a.hi < a.lo {
		return nil
	}
	rows, err := conn.Query(ctx, tbl.selectSQL+" WHERE id >= $1 AND id <= $2 ORDER BY id", a.lo, a.hi)
	if err != nil {
		return fmt.Errorf("audit: read the rows of %s: %w", tbl.plain, err)
	}
	defer rows.Close()
	var (
		ev                             outbox.Event
		agg, topic, eventType, headers pgtype.Text
		payload                        []byte
		h                              maphash.Hash
	)
	h.SetSeed(a.seed)
	for rows.Next() {
		if err := rows.Scan(&ev.ID, &agg, &payload, &topic, &eventType, &headers); err != nil {
			return fmt.Errorf("audit: read a row of %s: %w", tbl.plain, err)
		}
		ev.AggregateID, ev.Payload, ev.Topic, ev.EventType = agg.String, payload, topic.String, eventType.String
		ev.Headers = ev.Headers[:0]
		if headers.Valid {
			// A headers value the decoder refuses makes a bad event, which
			// outboxd never publishes as it is: its record, if any, is a
			// mismatch.
			ev.Headers, _ = replication.AppendJSONHeaders(ev.Headers, []byte(headers.String), a.cfg.Mapping.OwnHeaders())
		}
		rec := outbox.NewRecord(&ev, &a.cfg.Mapping, time.Time{}) // the timestamp is not compared
		name := rec.Topic
		if name == "" {
			name = noTopic
		}
		ti := a.topic(name)
		st := a.stats[ti]
		st.Rows++
		e := &a.entries[ev.ID-a.lo]
		e.flags |= flagRow
		if e.count == 0 {
			st.Missing.add(ev.ID, a.cfg.Examples)
			a.rep.addMissing(ev.ID)
			continue
		}
		if !a.cfg.CheckContent {
			continue
		}
		want := hashRecord(&h, rec.Key, rec.Value, len(rec.Headers), func(i int) ([]byte, []byte) {
			return []byte(rec.Headers[i].Key), rec.Headers[i].Value
		})
		if e.hash != want || e.topic != ti || e.flags&(flagDiffers|flagOtherTopic) != 0 {
			st.Mismatches.add(ev.ID, a.cfg.Examples)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: read the rows of %s: %w", tbl.plain, err)
	}
	return nil
}

// noTopic names, in the report, rows with no topic and no default topic:
// outboxd cannot publish them.
const noTopic = "(no topic)"

// hashRecord hashes a record's key, value and headers (without the origin
// header, which names the publisher, not the event), each length-prefixed
// so that no two different records hash the same input. A null and an empty
// value hash alike.
func hashRecord(h *maphash.Hash, key, value []byte, nh int, header func(int) ([]byte, []byte)) uint64 {
	h.Reset()
	var n [8]byte
	put := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(b)
	}
	put(key)
	put(value)
	for i := range nh {
		k, v := header(i)
		if string(k) == outbox.HeaderOrigin {
			continue
		}
		put(k)
		put(v)
	}
	return h.Sum64()
}

// parseID reads an outbox-id header's value; false when it is not a
// decimal integer (a uuid id, another producer's header).
func parseID(v []byte) (int64, bool) {
	id, err := strconv.ParseInt(string(v), 10, 64)
	return id, err == nil
}

// idHeader is the header carrying the event id in m's records.
func idHeader(m *outbox.Mapping) string {
	if m.IDHeader == "" {
		return outbox.HeaderOutboxID
	}
	return m.IDHeader
}
