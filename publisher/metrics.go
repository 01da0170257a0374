package publisher

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pipeline's Prometheus metrics. They outlive pipeline
// restarts: build them once per process and pass them in.
type Metrics struct {
	Published      *prometheus.CounterVec
	PublishedBytes *prometheus.CounterVec
	ProduceErrors  *prometheus.CounterVec
	DeadLettered   *prometheus.CounterVec
	InFlightEvents prometheus.Gauge
	InFlightBytes  prometheus.Gauge
	ConfirmedLSN   prometheus.Gauge
	ReceivedLSN    prometheus.Gauge
	CommitToAck    prometheus.Histogram
	Restarts       *prometheus.CounterVec
	Standby        prometheus.Gauge
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_events_published_total", Help: "Events acknowledged by Kafka.",
		}, []string{"topic"}),
		PublishedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_bytes_published_total", Help: "Key, value and header bytes acknowledged by Kafka.",
		}, []string{"topic"}),
		ProduceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_produce_errors_total", Help: "Produce failures after the producer's retries.",
		}, []string{"topic"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_poison_events_diverted_total", Help: "Poison events diverted to the dead-letter topic.",
		}, []string{"topic"}),
		InFlightEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_in_flight_events", Help: "Events produced and not yet acknowledged.",
		}),
		InFlightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_in_flight_bytes", Help: "Bytes produced and not yet acknowledged.",
		}),
		ConfirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_confirmed_lsn", Help: "End LSN of the last transaction whose events are all acknowledged.",
		}),
		ReceivedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_received_lsn", Help: "End LSN of the last transaction received.",
		}),
		CommitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outboxd_commit_to_ack_seconds",
			Help:    "Time from the Postgres commit to the Kafka acknowledgement of an event.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_pipeline_restarts_total", Help: "Pipeline restarts, by cause.",
		}, []string{"cause"}),
		Standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_standby", Help: "1 while another process holds the slot and this one waits.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Published, m.PublishedBytes, m.ProduceErrors, m.DeadLettered,
			m.InFlightEvents, m.InFlightBytes, m.ConfirmedLSN, m.ReceivedLSN, m.CommitToAck,
			m.Restarts, m.Standby)
	}
	return m
}

func (m *Metrics) observeLatency(commit time.Time) {
	m.CommitToAck.Observe(time.Since(commit).Seconds())
}
