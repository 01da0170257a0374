package testenv

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/IBM/sarama/mocks"
)

type openerFunc func(topic string, partition int32, offset int64) (sarama.PartitionConsumer, error)

func (f openerFunc) ConsumePartition(topic string, partition int32, offset int64) (sarama.PartitionConsumer, error) {
	return f(topic, partition, offset)
}

// A partition consumer sarama shut down (its Messages channel closed) is
// opened again past the last record read; no nil record is forwarded (a CI
// run's ReadAll handed TestRunPartitionedOutbox a nil message and it
// panicked).
func TestReadAllConsumesAgainAfterSaramaShutsAPartitionDown(t *testing.T) {
	first := mocks.NewConsumer(t, nil)
	pa := first.ExpectConsumePartition("t", 0, sarama.OffsetOldest)
	pa.YieldMessage(&sarama.ConsumerMessage{Value: []byte("0")})
	again := mocks.NewConsumer(t, nil)
	again.ExpectConsumePartition("t", 0, 1).YieldMessage(&sarama.ConsumerMessage{Value: []byte("1")})
	reopenedAt := make(chan int64, 1)
	open := openerFunc(func(topic string, partition int32, offset int64) (sarama.PartitionConsumer, error) {
		reopenedAt <- offset
		return again.ConsumePartition(topic, partition, offset)
	})
	pc, err := first.ConsumePartition("t", 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	msgs, done := make(chan *sarama.ConsumerMessage), make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		forward(open, pc, "t", 0, msgs, done)
	}()
	defer func() { close(done); <-ended }()
	next := func() *sarama.ConsumerMessage {
		select {
		case m := <-msgs:
			if m == nil {
				t.Fatal("a nil message was forwarded")
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no message within 10 s")
			return nil
		}
	}
	if m := next(); string(m.Value) != "0" {
		t.Fatalf("first message %q", m.Value)
	}
	pa.AsyncClose() // as sarama does on an offset out of range
	if m := next(); string(m.Value) != "1" || m.Offset != 1 {
		t.Fatalf("after the shutdown: %q at offset %d, want \"1\" at 1", m.Value, m.Offset)
	}
	if at := <-reopenedAt; at != 1 {
		t.Fatalf("consumed again from offset %d, want 1", at)
	}
}
