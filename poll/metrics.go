package poll

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
)

// Metrics are the shared publisher metrics (published, bytes, errors,
// dead-lettered, in flight, restarts, commit-to-ack) plus the poll's own.
// Build them once per process.
type Metrics struct {
	*outbox.Metrics
	// Polls counts polling transactions by outcome: empty, partial (fewer
	// rows than the batch size) or full.
	Polls *prometheus.CounterVec
	// BatchSeconds is the duration of a non-empty polling transaction, from
	// its SELECT to its COMMIT.
	BatchSeconds prometheus.Histogram
	// DeletedUnpublished counts rows deleted from the outbox before the
	// poller published them (a lower bound from the table's statistics):
	// rows --source=poll never publishes.
	DeletedUnpublished prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered). For the shared part, commit-to-ack is measured from the
// row's created_at: the poller cannot see commit times.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Metrics: outbox.NewMetrics(reg),
		Polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_poll_transactions_total", Help: "Polling transactions, by outcome: empty, partial or full batch.",
		}, []string{"outcome"}),
		BatchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outboxd_poll_batch_seconds",
			Help:    "Duration of a non-empty polling transaction, from SELECT to COMMIT.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		DeletedUnpublished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_poll_deleted_unpublished_rows_total",
			Help: "Rows deleted from the outbox before the poller published them (at least; from pg_stat_user_tables): never published, use --source=cdc.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Polls, m.BatchSeconds, m.DeletedUnpublished)
	}
	return m
}
