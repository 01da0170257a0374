package replication

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// TestStreamForeignMessageNotHeld: a role emits a 200 MB logical decoding
// message with another prefix in the middle of a transaction of
// outbox_emit events, on real PostgreSQL. Every event arrives, in order;
// the stream reports the foreign message with its size; and the process
// allocates far less than the message while reading it. Before the frame
// filter pgconn read the whole CopyData into one buffer: 200 MB of heap
// for one message from a role with no grants (900 MB took outboxd to
// 928 MiB RSS).
//
// Heap is measured as runtime.MemStats.TotalAlloc over the stream's life:
// every byte the process allocated, whatever the GC freed since, so it
// bounds the peak heap's growth from above without sampling. The test is
// not parallel, so nothing else in the process allocates meanwhile.
func TestStreamForeignMessageNotHeld(t *testing.T) {
	const size = 200_000_000
	e := newEmitDB(t)
	ctx := context.Background()
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT outbox_emit('t', 'k', '{"n": 2}')`,
		// Built by the server: the test process never holds it either.
		`SELECT pg_logical_emit_message(true, 'stranger', repeat('x', 200000000))`,
		`SELECT outbox_emit('t', 'k', '{"n": 3}')`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', 't', '{"n": 4}')`)

	var mu sync.Mutex
	var foreign []ForeignMessage
	cfg := DefaultStreamConfig()
	cfg.ConnString, cfg.Slot, cfg.Publication = e.connString, e.slot, e.pub
	cfg.StatusInterval, cfg.ConnectTimeout = 100*time.Millisecond, 30*time.Second
	cfg.Decoder.Messages = true
	cfg.OnForeignMessage = func(m ForeignMessage) {
		mu.Lock()
		defer mu.Unlock()
		foreign = append(foreign, m)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := Open(octx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ms := e.stream(s)
	for _, p := range []string{`{"n": 1}`, `{"n": 2}`, `{"n": 3}`, `{"n": 4}`} {
		wantEvent(t, ms, p)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d MiB while streaming a %d MB foreign message (heap in use %d MiB, from the OS %d MiB)",
		alloc>>20, size/1_000_000, after.HeapInuse>>20, after.Sys>>20)
	if alloc > size/4 {
		t.Errorf("allocated %d MiB while streaming, want well below the foreign message's %d MB: its content was held", alloc>>20, size/1_000_000)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(foreign) != 1 || foreign[0].Prefix != "stranger" || foreign[0].Size != size || !foreign[0].Transactional {
		t.Errorf("foreign messages reported: %+v, want the one of prefix stranger and %d bytes", foreign, size)
	}
}
