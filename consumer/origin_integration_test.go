package consumer

import (
	"context"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

// A dedup table of the first shape (outbox_id bigint PRIMARY KEY) is
// upgraded by Migrate: what it recorded stays a duplicate for events without
// an origin (as before); the same id from another origin (another outbox, or
// the same one after a restore) is new; uuid ids are deduplicated too.
func TestDedupOnOriginAndIDAfterUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE TABLE processed_outbox_ids (
    outbox_id    bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    duplicates   integer     NOT NULL DEFAULT 0)`)
	pg.Exec(t, `INSERT INTO processed_outbox_ids (outbox_id, topic) VALUES (1, 't'), (2, 't')`)
	conn := pg.Conn(t)
	for range 2 { // the second run finds the new shape and changes nothing
		if err := Migrate(ctx, conn, "processed_outbox_ids"); err != nil {
			t.Fatalf("Migrate on the old shape: %v", err)
		}
	}
	st, err := newPGStore(conn, "processed_outbox_ids")
	if err != nil {
		t.Fatal(err)
	}
	msg := func(id, origin, uuid string) *Message {
		cm := &sarama.ConsumerMessage{Topic: "t"}
		if uuid != "" {
			id = uuid
		}
		cm.Headers = []*sarama.RecordHeader{{Key: []byte(HeaderOutboxID), Value: []byte(id)}}
		if origin != "" {
			cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(HeaderOrigin), Value: []byte(origin)})
		}
		m, err := newMessage(cm)
		if err != nil {
			t.Fatalf("message %s: %v", id, err)
		}
		return m
	}
	nop := HandlerFunc(func(context.Context, pgx.Tx, *Message) error { return nil })
	var got []bool
	for _, m := range []*Message{
		msg("1", "", ""),           // recorded before the upgrade: duplicate
		msg("3", "", ""),           // new
		msg("1", "sys/db/0", ""),   // same id, an origin: new
		msg("1", "sys/db/1", ""),   // after a reset: new
		msg("1", "sys/db/1", ""),   // again: duplicate
		msg("1", "other/db/0", ""), // another outbox: new
		msg("", "sys/db/0", "0E5A5B6C-1D2E-4F00-8A9B-0C1D2E3F4A5B"), // uuid: new
		msg("", "sys/db/0", "0e5a5b6c-1d2e-4f00-8a9b-0c1d2e3f4a5b"), // same uuid, lower case: duplicate
	} {
		dup, err := st.attempt(ctx, m, nop)
		if err != nil {
			t.Fatalf("attempt %s/%s: %v", m.Origin, m.EventID, err)
		}
		got = append(got, dup)
	}
	if want := []bool{true, false, false, false, true, false, false, true}; !slices.Equal(got, want) {
		t.Fatalf("duplicates %v, want %v", got, want)
	}
	dup, err := st.attemptBatch(ctx, []*Message{msg("3", "", ""), msg("3", "sys/db/0", ""), msg("3", "sys/db/0", "")},
		BatchHandlerFunc(func(context.Context, pgx.Tx, []*Message) error { return nil }))
	if err != nil || !slices.Equal(dup, []bool{true, false, true}) {
		t.Fatalf("batch: dup %v err %v", dup, err)
	}
}
