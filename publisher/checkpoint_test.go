package publisher

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

var testID = Identity{SystemID: "7000000000000000001", Timeline: 1, Database: "db", Slot: "s"}

type cpHarness struct {
	t    *testing.T
	prod *fakeTxnProducer
	p    *Pipeline
	in   chan replication.Message
	err  chan error
}

// startCheckpointed runs a pipeline with checkpoints (in mode), starting at
// 1000, with an optional checkpoint read at start.
func startCheckpointed(t *testing.T, mode string, cp *Checkpoint) *cpHarness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Delivery = mode
	cfg.CheckpointInterval = time.Hour // ticks only when a test wants them
	h := &cpHarness{t: t, prod: &fakeTxnProducer{fakeProducer: newFakeProducer(), commits: make(chan struct{}, 10)},
		in: make(chan replication.Message, 100), err: make(chan error, 1)}
	h.p = NewPipeline(cfg, zap.NewNop(), h.prod, nil, nil, 1000, nil)
	if err := h.p.useCheckpoints(newCheckpointing("cp", testID, cp, 1000)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { h.err <- h.p.Run(ctx, h.in) }()
	return h
}

func (h *cpHarness) next() *kafka.Record {
	h.t.Helper()
	select {
	case r := <-h.prod.sentCh:
		return r
	case err := <-h.err:
		h.t.Fatalf("pipeline returned %v", err)
	case <-time.After(5 * time.Second):
		h.t.Fatal("no record sent")
	}
	return nil
}

func beginAt(final pglogrepl.LSN) replication.Message {
	m := begin()
	m.Begin.FinalLSN = final
	return m
}

// Rule (exactly-once): a Kafka transaction's records are confirmed to
// Postgres only after the transaction, with its checkpoint inside, committed.
func TestExactlyOnceConfirmsOnlyAfterTheKafkaCommit(t *testing.T) {
	h := startCheckpointed(t, ExactlyOnce, nil)
	h.in <- beginAt(1900)
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	r := h.next()
	h.prod.ack(r)
	cp := h.next()
	if cp.Topic != "cp" || string(cp.Key) != testID.Key() || !strings.Contains(string(cp.Value), `"end_lsn":"0/7D0"`) {
		t.Fatalf("checkpoint record %s %s %s, want end_lsn 0/7D0 (2000) for key %s", cp.Topic, cp.Key, cp.Value, testID.Key())
	}
	if got := h.p.Gate().Confirmable(2000); got != 1000 || h.p.Confirmed() != 1000 {
		t.Fatalf("before the commit: checkpointed %d, confirmed %d; want 1000 (nothing)", got, h.p.Confirmed())
	}
	h.prod.ack(cp)
	select {
	case <-h.prod.commits:
	case <-time.After(5 * time.Second):
		t.Fatal("no commit after the checkpoint was acknowledged")
	}
	waitUntil(t, "confirmed after the commit", func() bool { return h.p.Confirmed() == 2000 && h.p.Gate().Confirmable(2000) == 2000 })
}

// Rule (exactly-once): a Postgres transaction is never split across Kafka
// transactions, however small the limits.
func TestExactlyOnceNeverSplitsAPostgresTransaction(t *testing.T) {
	h := startCheckpointed(t, ExactlyOnce, nil)
	h.p.cfg.TxnMaxEvents = 1
	h.in <- beginAt(1900)
	for i := int64(1); i <= 3; i++ {
		h.in <- event(i, "a", "t")
	}
	h.in <- commit(2000)
	for i := 0; i < 3; i++ {
		r := h.next()
		if r.Topic == "cp" {
			t.Fatalf("a checkpoint (a commit) after %d of the transaction's 3 events", i)
		}
		h.prod.ack(r)
	}
	if cp := h.next(); cp.Topic != "cp" {
		t.Fatalf("after the Postgres commit: %s, want the checkpoint", cp.Topic)
	}
}

// Rule: transactions the checkpoint covers (commit record before it) are
// skipped on replay, not re-published; the next one is published.
func TestCheckpointSkipsReplayedTransactions(t *testing.T) {
	h := startCheckpointed(t, AtLeastOnce, &Checkpoint{SystemID: testID.SystemID, EndLSN: 1500})
	h.in <- beginAt(1200)
	h.in <- event(1, "a", "t")
	h.in <- commit(1300)
	h.in <- beginAt(1600)
	h.in <- event(2, "a", "t")
	h.in <- commit(1700)
	if r := h.next(); r.OutboxID != 2 {
		t.Fatalf("sent outbox id %d first, want 2 (1 is below the checkpoint)", r.OutboxID)
	}
}

// Rule (at-least-once): the stream may confirm only what a checkpoint
// record holds; one is written as soon as it wants more.
func TestAtLeastOnceConfirmsOnlyWhatIsCheckpointed(t *testing.T) {
	h := startCheckpointed(t, AtLeastOnce, nil)
	h.in <- beginAt(1900)
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	h.prod.ack(h.next())
	waitUntil(t, "watermark", func() bool { return h.p.Confirmed() == 2000 })
	if got := h.p.Gate().Confirmable(2000); got != 1000 {
		t.Fatalf("checkpointed %d before any checkpoint record, want 1000", got)
	}
	h.in <- beginAt(2100) // the next commit triggers the checkpoint write
	h.in <- commit(2200)
	cp := h.next()
	if cp.Topic != "cp" || !strings.Contains(string(cp.Value), `"end_lsn":"0/7D0"`) {
		t.Fatalf("got %s %s, want a checkpoint at 0/7D0", cp.Topic, cp.Value)
	}
	h.prod.ack(cp)
	waitUntil(t, "checkpointed", func() bool { return h.p.Gate().Confirmable(2000) == 2000 })
}

// Rule: the checkpoint's highest outbox id counts rows only. An
// outbox_emit message's id is its LSN, far past any row id: counted, it
// made "checkpoint reset" move the table's sequence past the LSN (or try
// to, past an int4 sequence's maximum).
func TestCheckpointMaxOutboxIDCountsRowsOnly(t *testing.T) {
	for _, mode := range []string{AtLeastOnce, ExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			h := startCheckpointed(t, mode, &Checkpoint{SystemID: testID.SystemID, EndLSN: 1000, MaxOutboxID: 5})
			msg := event(0x16DAA978, "a", "t")
			msg.Event.IDIsLSN = true
			h.in <- beginAt(1900)
			h.in <- event(7, "a", "t")
			h.in <- msg
			h.in <- commit(2000)
			h.prod.ack(h.next())
			h.prod.ack(h.next())
			if mode == AtLeastOnce {
				waitUntil(t, "watermark", func() bool { return h.p.Confirmed() == 2000 })
				h.p.Gate().Confirmable(2000) // the stream wants 2000 confirmed
				h.in <- beginAt(2100)        // the next commit triggers the checkpoint write
				h.in <- commit(2200)
			}
			r := h.next()
			cp, err := ParseCheckpoint(r.Value)
			if r.Topic != "cp" || err != nil || cp.MaxOutboxID != 7 {
				t.Fatalf("checkpoint %s %s (%v), want max_outbox_id 7 (the row, not the message's LSN)", r.Topic, r.Value, err)
			}
		})
	}
}

func TestCheckGap(t *testing.T) {
	if err := checkGap(nil, testID, 5000, "cp"); err != nil {
		t.Fatalf("no checkpoint (a first start): %v", err)
	}
	if err := checkGap(&Checkpoint{SystemID: testID.SystemID, EndLSN: 5000}, testID, 4000, "cp"); err != nil {
		t.Fatalf("slot behind the checkpoint (a replay): %v", err)
	}
	err := checkGap(&Checkpoint{SystemID: testID.SystemID, EndLSN: 4000}, testID, 5000, "cp")
	if !errors.Is(err, ErrGap) || !strings.Contains(err.Error(), "0/1388") || !strings.Contains(err.Error(), "0/FA0") || !strings.Contains(err.Error(), "--accept-gap") {
		t.Fatalf("slot ahead: %v, want ErrGap naming both positions and --accept-gap", err)
	}
	err = checkGap(&Checkpoint{SystemID: "other", EndLSN: 9000}, testID, 5000, "cp")
	if !errors.Is(err, ErrGap) || !strings.Contains(err.Error(), "system other") {
		t.Fatalf("another system's checkpoint: %v", err)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	in := Checkpoint{SystemID: "7", Database: "d", DatabaseOID: 16384, Slot: "s", Timeline: 2, EndLSN: 0x16B3748, CommitLSN: 0x16B3700, Xid: 42,
		CommitTime: time.Unix(1700000000, 0).UTC(), WrittenAt: time.Unix(1700000001, 0).UTC(), Epoch: 12}
	b, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseCheckpoint(b)
	if err != nil || !reflect.DeepEqual(*out, in) {
		t.Fatalf("round trip of %s: %+v, %v", b, out, err)
	}
}

// Rule: exactly-once delivery is chosen only with a producer that can
// commit and abort Kafka transactions; otherwise the session fails at once
// with the reason, instead of panicking at its first commit.
func TestExactlyOnceNeedsATransactionalProducer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Delivery = ExactlyOnce
	p := NewPipeline(cfg, zap.NewNop(), newFakeProducer(), nil, nil, 1000, nil)
	if err := p.useCheckpoints(newCheckpointing("cp", testID, nil, 1000)); err == nil || !strings.Contains(err.Error(), "transactional producer") {
		t.Fatalf("useCheckpoints = %v, want an error naming the transactional producer", err)
	}
	tp := &fakeTxnProducer{fakeProducer: newFakeProducer(), commits: make(chan struct{}, 1)}
	p = NewPipeline(cfg, zap.NewNop(), tp, nil, nil, 1000, nil)
	if err := p.useCheckpoints(newCheckpointing("cp", testID, nil, 1000)); err != nil {
		t.Fatalf("useCheckpoints with a transactional producer = %v", err)
	}
	if _, ok := p.mode.(*transactional); !ok {
		t.Fatalf("mode %T, want *transactional", p.mode)
	}
}
