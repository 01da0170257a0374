package consumer

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/IBM/sarama"
)

// A batch closes once its messages reach BatchMaxBytes, so a partition's
// batch holds at most BatchMaxBytes plus one message, whatever BatchSize
// allows, and a consumer's memory is bounded whatever the messages' size.
// Fails if collect counts messages only.
func TestBatchMaxBytesClosesABatch(t *testing.T) {
	t.Parallel()
	cfg := batchConfig(100)
	big := func(offset, id int64) *sarama.ConsumerMessage {
		m := msg(offset, id, "a")
		m.Value = []byte(`{"pad":"` + strings.Repeat("x", 1000) + `"}`)
		return m
	}
	cfg.BatchMaxBytes = 2*messageBytes(big(0, 1)) + 100
	r := newRig(t, cfg)
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, cfg, r, &done, sess)
	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, 10)}
	for i := range int64(5) {
		claim.msgs <- big(10+i, 1+i)
	}
	close(claim.msgs)
	wait := runClaim(t, g, sess, claim)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{1, 2, 3}, {4, 5}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v (closed at %d bytes)", r.h.batches, want, cfg.BatchMaxBytes)
	}
}
