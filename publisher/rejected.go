package publisher

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// rejectLogEvery bounds the warnings about rejected messages: whoever can
// emit them (any role, unless pg_logical_emit_message is revoked from
// PUBLIC) must not be able to flood the log.
const rejectLogEvery = 10 * time.Second

// rejectLog rate-limits the warnings about rejected messages. It outlives
// pipeline restarts: one per process, in Metrics.
type rejectLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether to log now, and how many were suppressed since the
// last warning.
func (l *rejectLog) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < rejectLogEvery {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}

// rejected accounts for a message with outboxd's prefix that outbox_emit
// did not provably write: counted, logged (rate-limited) with its LSN and
// transaction id, and skipped. The transaction's other events are
// published and its end LSN confirmed as usual.
func (p *Pipeline) rejected(b replication.Begin, inTxn bool, r replication.Rejected) {
	p.m.RejectedMessages.WithLabelValues(r.Reason).Inc()
	ok, suppressed := p.m.rejects.allow(time.Now())
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
