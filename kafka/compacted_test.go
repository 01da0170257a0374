package kafka

import (
	"context"
	"testing"
	"time"
)

// Another deployment's open transaction on the shared checkpoint topic
// neither hides nor delays this deployment's latest committed checkpoint:
// the read goes to the high watermark without waiting at the last stable
// offset, and decides each record by its own producer's marker. A record
// of a transaction still open (here this producer's own) does not count
// until it commits.
func TestReadCompactedIsNotHeldByOthersOpenTransactions(t *testing.T) {
	f := startFakeKafka(t, 1, "cp")
	put := func(p *Producer, key, value string) {
		r := &Record{Topic: "cp", Key: []byte(key), Value: []byte(value)}
		sendAll(t, p, r)
		if r := results(t, p, 1)[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	a := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-a"))
	other := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-other"))
	put(a, "a", "1")
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	put(other, "other", "open") // left open: holds the last stable offset
	put(a, "a", "2")
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	put(a, "a", "3") // open too: not committed yet

	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.CheckpointReadTimeout = 5 * time.Second
	began := time.Now()
	got, err := ReadCompacted(context.Background(), cfg, "cp")
	took := time.Since(began)
	if err != nil {
		t.Fatalf("ReadCompacted with another producer's transaction open: %v", err)
	}
	if string(got["a"]) != "2" || len(got) != 1 {
		t.Fatalf("ReadCompacted = %q, want only a=2 (the latest committed; a=3 and other are open)", got)
	}
	if took > 2*time.Second {
		t.Fatalf("ReadCompacted took %s: it waited for the open transactions", took)
	}
	t.Logf("read past two open transactions in %s", took.Round(time.Millisecond))

	if err := other.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err = ReadCompacted(context.Background(), cfg, "cp")
	if err != nil {
		t.Fatal(err)
	}
	if string(got["a"]) != "3" || string(got["other"]) != "open" {
		t.Fatalf("after both commits ReadCompacted = %q, want a=3 other=open", got)
	}
}
