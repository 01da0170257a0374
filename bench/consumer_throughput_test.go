package main

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestConsumerThroughput runs consumerThroughput small against the stack,
// one message per transaction and batches of 100, and checks the result's
// shape, never its timings.
func TestConsumerThroughput(t *testing.T) {
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	st := stack{AdminDSN: pg.AdminDSN, Brokers: k.Brokers}
	for _, batch := range []int{1, 100} {
		res, err := consumerThroughput(context.Background(), st, 2, 2000, batch, t.Logf)
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		if res.Err != "" || res.Partitions != 2 || res.Messages != 2000 || res.BatchSize != batch {
			t.Fatalf("batch %d: result %+v", batch, res)
		}
		if res.Seconds <= 0 || math.Abs(res.MessagesPerSec*res.Seconds-2000) > 1e-6 || math.Abs(res.PerPartitionPerSec*2-res.MessagesPerSec) > 1e-6 {
			t.Fatalf("batch %d: inconsistent rates %+v", batch, res)
		}
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		var keys map[string]any
		if err := json.Unmarshal(b, &keys); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"partitions", "messages", "batch_size", "seconds", "messages_per_sec", "per_partition_per_sec"} {
			if _, ok := keys[k]; !ok {
				t.Errorf("batch %d: JSON %s has no %q", batch, b, k)
			}
		}
	}
	if _, err := consumerThroughput(context.Background(), st, 1, 10, 0, t.Logf); err == nil {
		t.Fatal("batch size 0: no error")
	}
}
