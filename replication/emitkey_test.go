package replication

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// emitDB is a fresh database migrated by outboxd, with a publication of
// the outbox table and a pgoutput slot of its own.
type emitDB struct {
	t          *testing.T
	pg         *testenv.PG
	conn       *pgx.Conn
	slot, pub  string
	connString string // what the stream connects with
}

func newEmitDB(t *testing.T) *emitDB {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatalf("migrations.Apply: %v", err)
	}
	e := &emitDB{t: t, pg: pg, conn: conn, slot: testenv.UniqueName("mac"), pub: "outboxd", connString: pg.DSN}
	e.exec(`CREATE PUBLICATION outboxd FOR TABLE outbox`)
	e.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot)
	return e
}

func (e *emitDB) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.conn.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// withParam is the stream's connection string with a run-time parameter
// set, as a role's own settings would set it.
func (e *emitDB) withParam(name, value string) string {
	e.t.Helper()
	u, err := url.Parse(e.pg.DSN)
	if err != nil {
		e.t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value) // pgconn sends an unknown parameter as a run-time one
	u.RawQuery = q.Encode()
	return u.String()
}

// open starts a stream reading outbox_emit's messages.
func (e *emitDB) open(connString string) (*Stream, error) {
	cfg := DefaultStreamConfig()
	cfg.ConnString, cfg.Slot, cfg.Publication = connString, e.slot, e.pub
	cfg.StatusInterval, cfg.ConnectTimeout = 100*time.Millisecond, 30*time.Second
	cfg.Decoder.Messages = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return Open(ctx, cfg, zaptest.NewLogger(e.t))
}

// stream runs s and returns its events, rejections and bad events as they
// come.
func (e *emitDB) stream(s *Stream) <-chan Message {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	progress := newFakeProgress(s.StartLSN())
	out := make(chan Message, 64)
	found := make(chan Message, 64)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out, progress, nil) }()
	go func() {
		for m := range out {
			switch m.Kind {
			case KindEvent, KindRejected, KindBad:
				found <- m
			case KindCommit:
				progress.confirm(m.Commit.EndLSN)
			}
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		progress.finish()
		if err := <-done; err != nil {
			e.t.Errorf("stream: %v", err)
		}
		s.Close()
	})
	return found
}

// next is the next event or rejection, or a failure after a minute.
func next(t *testing.T, ms <-chan Message) Message {
	t.Helper()
	select {
	case m := <-ms:
		return m
	case <-time.After(time.Minute):
		t.Fatal("no event or rejection within a minute")
		return Message{}
	}
}

func wantEvent(t *testing.T, ms <-chan Message, payload string) {
	t.Helper()
	if m := next(t, ms); m.Kind != KindEvent || string(m.Event.Payload) != payload {
		t.Fatalf("got %v %+v (payload %q), want the event %s", m.Kind, m.Rejected, m.Event.Payload, payload)
	}
}

// capturedMessages are the contents of the outboxd messages the slot holds,
// as anyone who can read WAL sees them (here: a peek that consumes
// nothing).
func (e *emitDB) capturedMessages() [][]byte {
	e.t.Helper()
	rows, err := e.conn.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'outboxd', 'messages', 'true')`, e.slot)
	if err != nil {
		e.t.Fatal(err)
	}
	var out [][]byte
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			e.t.Fatal(err)
		}
		var m logicalMessage
		if len(b) > 0 && b[0] == 'M' && m.decode(b) == nil && string(m.prefix) == MessagePrefix {
			out = append(out, bytes.Clone(m.content))
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestStreamRejectsReplayedMessage: content outbox_emit signed, captured
// from WAL and emitted again in a new transaction by a role with no grants
// at all, is rejected as replayed; the original (one written inside a
// savepoint too) and an event after it are events. With a MAC over the
// content alone the replay was published again under a new outbox-id.
func TestStreamRejectsReplayedMessage(t *testing.T) {
	t.Parallel()
	e := newEmitDB(t)
	ctx := context.Background()
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		// The subtransaction takes an xid of its own before outbox_emit
		// runs: the MAC must still name the top-level one, which is all
		// pgoutput's Begin carries.
		if _, err := tx.Exec(ctx, `SAVEPOINT s; SELECT pg_logical_emit_message(true, 'not-outboxd', 'x')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT outbox_emit('t', 'k', '{"n": 2}')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	captured := e.capturedMessages()
	if len(captured) != 2 || !bytes.HasPrefix(captured[0], []byte(messageV3)) {
		t.Fatalf("captured %q, want the two v3 messages", captured)
	}
	role := testenv.UniqueName("nogrant")
	e.exec(`CREATE ROLE ` + pgx.Identifier{role}.Sanitize())
	t.Cleanup(func() { _, _ = e.conn.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize()) })
	err = pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::bytea)`, captured[0])
		return err
	})
	if err != nil {
		t.Fatalf("the no-grant role could not emit (PUBLIC holds EXECUTE by default): %v", err)
	}
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 3}')`)

	s, err := e.open(e.connString)
	if err != nil {
		t.Fatal(err)
	}
	ms := e.stream(s)
	wantEvent(t, ms, `{"n": 1}`)
	wantEvent(t, ms, `{"n": 2}`)
	if m := next(t, ms); m.Kind != KindRejected || m.Rejected.Reason != RejectReplayed {
		t.Fatalf("the replay: %v %+v (payload %q), want rejected %s", m.Kind, m.Rejected, m.Event.Payload, RejectReplayed)
	}
	wantEvent(t, ms, `{"n": 3}`)
}

// TestStreamFindsKeyWhateverSearchPath: the key is read from the outbox
// table's schema by name, so a connection whose search_path misses that
// schema still reads messages (it was told "not installed" and confirmed
// past them), and a key table planted in a schema earlier on the path is
// not used (every real event was rejected as bad_mac).
func TestStreamFindsKeyWhateverSearchPath(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, searchPath string
	}{
		{"schema not on the path", "pg_catalog"},
		{"planted key earlier on the path", "planted,public"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEmitDB(t)
			e.exec(`CREATE SCHEMA planted`)
			e.exec(`CREATE TABLE planted.outbox_emit_key (LIKE public.outbox_emit_key INCLUDING ALL)`)
			e.exec(`INSERT INTO planted.outbox_emit_key (key, next_key, installed_lsn, v3_installed_lsn)
				VALUES ('\x` + strings.Repeat("01", 32) + `', '\x` + strings.Repeat("02", 32) + `', '0/0', '0/0')`)
			e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
			s, err := e.open(e.withParam("search_path", tt.searchPath))
			if err != nil {
				t.Fatal(err)
			}
			wantEvent(t, e.stream(s), `{"n": 1}`)
		})
	}
}

// TestStreamKeepsVerifyingAcrossRotation: outbox_emit_rotate_key() keeps
// the pads in step with the key, and a session that started before the
// rotation verifies what is signed after it; a session that starts after
// it still verifies what the retired key signed. Before, rotating was an
// UPDATE of the key that left the pads stale: every later event was
// rejected as bad_mac.
func TestStreamKeepsVerifyingAcrossRotation(t *testing.T) {
	t.Parallel()
	e := newEmitDB(t)
	later := testenv.UniqueName("mac")
	e.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, later)
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	s, err := e.open(e.connString)
	if err != nil {
		t.Fatal(err)
	}
	ms := e.stream(s)
	wantEvent(t, ms, `{"n": 1}`)
	var before []byte
	if err := e.conn.QueryRow(context.Background(), `SELECT key FROM outbox_emit_key`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	e.exec(`SELECT outbox_emit_rotate_key()`)
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 2}')`)
	wantEvent(t, ms, `{"n": 2}`)

	var after, previous, ipad, opad []byte
	if err := e.conn.QueryRow(context.Background(), `SELECT key, previous_key, key_ipad, key_opad FROM outbox_emit_key`).Scan(&after, &previous, &ipad, &opad); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(after, before) || !bytes.Equal(previous, before) || !bytes.Equal(ipad, hmacPad(after, 0x36)) || !bytes.Equal(opad, hmacPad(after, 0x5c)) {
		t.Fatalf("after the rotation: key %x (was %x), previous %x, pads %x %x", after, before, previous, ipad, opad)
	}

	// A session started after the rotation, on a slot that still holds
	// both messages.
	e.slot = later
	s2, err := e.open(e.connString)
	if err != nil {
		t.Fatal(err)
	}
	ms2 := e.stream(s2)
	wantEvent(t, ms2, `{"n": 1}`)
	wantEvent(t, ms2, `{"n": 2}`)
}

// TestStreamRefusesStalePads: pads that do not match the key (here made by
// a changed outbox_emit_pad) stop the session at start with one line
// naming the fix, instead of rejecting every event as bad_mac.
func TestStreamRefusesStalePads(t *testing.T) {
	t.Parallel()
	e := newEmitDB(t)
	e.exec(`CREATE OR REPLACE FUNCTION outbox_emit_pad(k bytea, pad integer) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$ SELECT k $$`)
	e.exec(`SELECT outbox_emit_rotate_key()`)
	_, err := e.open(e.connString)
	if !errors.Is(err, ErrMessageKey) || !strings.Contains(err.Error(), "outbox_emit_rotate_key()") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("open: %v, want one line wrapping ErrMessageKey that names the fix", err)
	}
}

// TestStreamRefusesKeyOfMigration007: a key table without migration 008's
// columns means outbox_emit still writes replayable v2 messages: the
// session refuses to start and names "outboxd migrate".
func TestStreamRefusesKeyOfMigration007(t *testing.T) {
	t.Parallel()
	e := newEmitDB(t)
	e.exec(`ALTER TABLE outbox_emit_key DROP COLUMN v3_installed_lsn`)
	_, err := e.open(e.connString)
	if !errors.Is(err, ErrMessageKey) || !strings.Contains(err.Error(), `run "outboxd migrate"`) {
		t.Fatalf("open: %v, want ErrMessageKey naming outboxd migrate", err)
	}
}

func TestParseKeyRowChecksPads(t *testing.T) {
	key := bytes.Repeat([]byte{0xA5}, 32)
	row := func(ipad []byte) [][]byte {
		h := func(b []byte) []byte { return []byte(hex.EncodeToString(b)) }
		return [][]byte{h(key), h(ipad), h(hmacPad(key, 0x5c)), h(key), nil, []byte("0/10"), []byte("0/20"), []byte("42")}
	}
	k, err := parseKeyRow(row(hmacPad(key, 0x36)))
	if err != nil || k.V2Until != 0x20 || k.NextXid != 42 || k.Previous != nil {
		t.Fatalf("parseKeyRow: %+v, %v", k, err)
	}
	stale := hmacPad(bytes.Repeat([]byte{1}, 32), 0x36)
	if _, err := parseKeyRow(row(stale)); err == nil || !strings.Contains(err.Error(), "do not match") {
		t.Fatalf("stale ipad: err %v", err)
	}
}
