package outbox

import (
	"testing"
	"time"
)

// BenchmarkEventToRecord is the per-event mapping on the produce hot path:
// outbox event → kafka.Record (the producer encodes records into its batch
// directly).
func BenchmarkEventToRecord(b *testing.B) {
	ev := Event{ID: 123456, AggregateID: "order-42", Topic: "brew.orders.v1",
		Payload: []byte(`{"id": 42, "status": "created"}`), CreatedAt: time.Unix(1700000000, 0)}
	b.ReportAllocs()
	for b.Loop() {
		_ = NewRecord(&ev, &Mapping{}, time.Time{})
	}
}
