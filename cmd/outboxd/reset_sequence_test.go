package main

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestMoveSequenceStaysWithinItsType: checkpoint reset moves an int4 id
// sequence past a highest id it can hold, up to its maximum, and leaves it
// alone (saying so, without failing) for one it cannot hold — such an id
// is no row's: an older outboxd counted outbox_emit messages' LSNs as ids.
// The same for an int4 column fed by a bigint sequence, which setval would
// have moved past what the column holds. Before, the LSN made setval fail
// the whole reset on the int4 sequence and broke the int4 column's inserts.
func TestMoveSequenceStaysWithinItsType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	pg.Exec(t, `CREATE TABLE serial_ids (id serial PRIMARY KEY)`)
	pg.Exec(t, `CREATE TABLE int_ids (id integer PRIMARY KEY)`)
	pg.Exec(t, `CREATE SEQUENCE int_ids_id_seq OWNED BY int_ids.id`) // bigint, the default
	pg.Exec(t, `ALTER TABLE int_ids ALTER COLUMN id SET DEFAULT nextval('int_ids_id_seq')`)
	const lsn = 0x1_16DAA978 // an outbox_emit message's id in an old checkpoint
	for _, tt := range []struct {
		table       string
		maxID, next int64 // next: the next id the sequence hands out
		say         string
	}{
		{"serial_ids", 2147483000, 2147483001, "moved past outbox id 2147483000"},
		{"serial_ids", lsn, 2147483002, "NOT moved"}, // left where the insert above took it
		{"int_ids", lsn, 1, "NOT moved"},
		{"int_ids", 2147483647, 0, "to its maximum 2147483647"},
	} {
		var o options
		o.slot.Schema, o.slot.Table = "public", tt.table
		said, err := moveSequence(ctx, conn, &o, tt.maxID)
		if err != nil || !strings.Contains(said, tt.say) {
			t.Fatalf("%s past %d: %q, %v; want it to say %q", tt.table, tt.maxID, said, err, tt.say)
		}
		if tt.next == 0 {
			continue
		}
		var next int64
		if err := conn.QueryRow(ctx, `INSERT INTO `+tt.table+` DEFAULT VALUES RETURNING id`).Scan(&next); err != nil {
			t.Fatalf("%s: insert after the reset: %v", tt.table, err)
		}
		if next != tt.next {
			t.Fatalf("%s: next id %d after moving past %d, want %d", tt.table, next, tt.maxID, tt.next)
		}
	}
}
