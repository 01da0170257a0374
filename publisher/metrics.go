package publisher

import (
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// observeReceived observes one event of the transaction b: from its commit
// to when the stream read its Begin (or now, for a source that does not say).
func observeReceived(m *outbox.Metrics, b replication.Begin) {
	at := b.Received
	if at.IsZero() {
		at = time.Now()
	}
	m.CommitToReceive.Observe(at.Sub(b.CommitTime).Seconds())
}
