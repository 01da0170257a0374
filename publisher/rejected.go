package publisher

import (
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// rejected accounts for a message with outboxd's prefix that outbox_emit
// did not provably write: counted, logged (rate-limited) with its LSN and
// transaction id, and skipped. The transaction's other events are
// published and its end LSN confirmed as usual.
func (p *Pipeline) rejected(b replication.Begin, inTxn bool, r replication.Rejected) {
	p.m.RejectedMessages.WithLabelValues(r.Reason).Inc()
	ok, suppressed := p.m.Rejects.Allow(time.Now())
	if !ok {
		return
	}
	fields := []zap.Field{zap.Stringer("lsn", r.LSN), zap.String("reason", r.Reason), zap.String("detail", r.Detail)}
	if inTxn {
		fields = append(fields, zap.Uint32("xid", b.Xid))
	}
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed_since_last", suppressed))
	}
	p.log.Warn("skipped a logical decoding message with outboxd's prefix that outbox_emit did not write (never published; see outboxd_rejected_messages_total)", fields...)
}
