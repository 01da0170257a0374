package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// Transactions against kfake: commit, abort, fencing, and what
// read_committed readers see.

func txnConfig(brokers []string, id string) Config {
	c := testKafkaConfig(brokers)
	c.TransactionalID = id
	return c
}

// A transaction's records are visible to read_committed consumers once
// Commit returned, and never when it was aborted.
func TestKafkaProducerTransactionCommitAndAbort(t *testing.T) {
	f := startFakeKafka(t, 2, "t")
	p := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-1"))
	sendAll(t, p, rec(1, "t", "a"), rec(2, "t", "b"))
	for _, r := range results(t, p, 2) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if err := p.Commit(context.Background()); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	sendAll(t, p, rec(3, "t", "a"))
	results(t, p, 1)
	if err := p.Abort(context.Background()); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	sendAll(t, p, rec(4, "t", "a"))
	results(t, p, 1)
	if err := p.Commit(context.Background()); err != nil {
		t.Fatalf("second Commit: %v", err)
	}
	got := readCommitted(t, f.c.ListenAddrs(), "t", 3)
	slices.Sort(got)
	if fmt.Sprint(got) != "[1 2 4]" {
		t.Fatalf("read_committed saw %v, want [1 2 4] (3 was aborted)", got)
	}
}

// A second producer with the same transactional id fences the first: its
// next commit fails with ErrFenced, and what it wrote is never visible.
func TestKafkaProducerTransactionZombieIsFenced(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	a := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-z"))
	sendAll(t, a, rec(1, "t", "a"))
	results(t, a, 1)
	b := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-z")) // aborts a's open transaction
	sendAll(t, a, rec(2, "t", "a"))
	results(t, a, 1)
	if err := a.Commit(context.Background()); !errors.Is(err, ErrFenced) && !errors.Is(err, ErrTxnFailed) {
		t.Fatalf("zombie's Commit: %v, want fenced", err)
	}
	sendAll(t, b, rec(3, "t", "a"))
	results(t, b, 1)
	if err := b.Commit(context.Background()); err != nil {
		t.Fatalf("new producer's Commit: %v", err)
	}
	if got := readCommitted(t, f.c.ListenAddrs(), "t", 1); fmt.Sprint(got) != "[3]" {
		t.Fatalf("read_committed saw %v, want only [3]", got)
	}
}

// ReadCompacted sees what a read_committed reader sees: the last committed
// value per key, nothing of an aborted transaction.
func TestReadCompactedSkipsAbortedTransactions(t *testing.T) {
	f := startFakeKafka(t, 1, "cp")
	cfg := txnConfig(f.c.ListenAddrs(), "tx-cp")
	p := newTestProducer(t, cfg)
	put := func(key, value string) {
		r := &Record{Topic: "cp", Key: []byte(key), Value: []byte(value)}
		sendAll(t, p, r)
		if r := results(t, p, 1)[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	put("a", "1")
	put("b", "1")
	if err := p.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	put("a", "2")
	if err := p.Abort(context.Background()); err != nil {
		t.Fatal(err)
	}
	put("b", "3")
	if err := p.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCompacted(context.Background(), testKafkaConfig(f.c.ListenAddrs()), "cp")
	if err != nil {
		t.Fatal(err)
	}
	if string(got["a"]) != "1" || string(got["b"]) != "3" || len(got) != 2 {
		t.Fatalf("ReadCompacted = %q, want a=1 (a=2 was aborted) b=3", got)
	}
}
