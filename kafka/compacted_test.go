package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Another deployment's open transaction on the shared checkpoint topic
// must not hide this deployment's later, committed checkpoint: the read
// goes on to the high watermark, waiting for the transaction to end — and
// names it when it does not end in time.
func TestReadCompactedWaitsOutOthersOpenTransactions(t *testing.T) {
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

	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.CheckpointReadTimeout = 300 * time.Millisecond
	_, err := ReadCompacted(context.Background(), cfg, "cp")
	var ote *OpenTxnError
	if !errors.As(err, &ote) || !strings.Contains(err.Error(), `"tx-other"`) {
		t.Fatalf("ReadCompacted with the transaction still open: %v, want an OpenTxnError naming tx-other", err)
	}
	t.Log(err)

	cfg.CheckpointReadTimeout = 10 * time.Second
	done := make(chan error, 1)
	go func() { done <- other.Commit(context.Background()) }()
	got, err := ReadCompacted(context.Background(), cfg, "cp")
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if string(got["a"]) != "2" {
		t.Fatalf("ReadCompacted returned a=%q, want 2 (the latest committed checkpoint)", got["a"])
	}
}
