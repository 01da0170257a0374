package outbox

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/slot"
)

// Metrics are the sources' Prometheus metrics. They outlive pipeline
// restarts: build them once per process and pass them in.
type Metrics struct {
	Published      *prometheus.CounterVec
	PublishedBytes *prometheus.CounterVec
	ProduceErrors  *prometheus.CounterVec
	DeadLettered   *prometheus.CounterVec
	// RejectedMessages counts logical decoding messages with outboxd's
	// prefix that outbox_emit did not provably write (see publisher/rejected.go).
	RejectedMessages *prometheus.CounterVec
	// ForeignMessages and ForeignMessageBytes count the logical decoding
	// messages with another prefix whose content the replication stream
	// dropped unread (replication.ForeignMessage), and their content bytes.
	ForeignMessages     prometheus.Counter
	ForeignMessageBytes prometheus.Counter
	// BadEvents counts events that cannot become a record (see publisher/badevent.go).
	BadEvents      *prometheus.CounterVec
	InFlightEvents prometheus.Gauge
	InFlightBytes  prometheus.Gauge
	ConfirmedLSN   prometheus.Gauge
	ReceivedLSN    prometheus.Gauge
	CommitToAck    prometheus.Histogram
	// CommitToReceive is the PostgreSQL side of CommitToAck: commit → the
	// stream read the transaction off the connection (the walsender's
	// decoding and sending, the network). CommitToAck minus it is outboxd's
	// own queueing and Kafka.
	CommitToReceive prometheus.Histogram
	Restarts        *prometheus.CounterVec
	Standby         prometheus.Gauge
	// State is 1 for the supervisor's current state and 0 for the others
	// (see SetState), so an alert can name the state it means.
	State *prometheus.GaugeVec
	// LastEventTimestamp is when Kafka last acknowledged an event, in Unix
	// seconds; 0 before the first. A timestamp rather than a "seconds
	// since" gauge, the Prometheus way: it is right whenever it is scraped
	// (time() - it gives the age in any query), needs no clock at scrape
	// time, and a missed scrape loses nothing.
	LastEventTimestamp prometheus.Gauge
	// ProduceRetries and ProduceRecovery observe the Kafka producer (see
	// kafka.ProducerHooks).
	ProduceRetries  *prometheus.CounterVec
	ProduceRecovery prometheus.Histogram

	// Set by the slot poller (see SlotPollerMetrics): they describe the
	// slot, so every instance polling it reports the same values.
	ServerWALLSN         prometheus.Gauge
	LagBytes             prometheus.Gauge
	SlotRetainedWALBytes prometheus.Gauge
	SlotPolls            *prometheus.CounterVec
	// SlotActive is pg_replication_slots.active: 1 while some process
	// streams from the slot (this one or another instance).
	SlotActive prometheus.Gauge
	// SlotWALStatus is 1 for the slot's wal_status and 0 for the others;
	// status="missing" (not a PostgreSQL value) when the slot is not in
	// pg_replication_slots. All 0 until the first poll answered, so that
	// no alert fires on a process that has not looked yet.
	SlotWALStatus *prometheus.GaugeVec
	// SlotSafeWALSize is pg_replication_slots.safe_wal_size, exported only
	// when PostgreSQL gives one: it is NULL with max_slot_wal_keep_size =
	// -1 (nothing bounds the slot's WAL) and once the slot is lost. No
	// series rather than a -1, so that min() and a "below N bytes" alert
	// need no filter for a value that is not a size. A vector without
	// labels, because only a vector can drop its one series.
	SlotSafeWALSize *prometheus.GaugeVec

	// LagSeconds is computed at scrape time from the watermark of the latest
	// pipeline: now − commit time of the oldest unconfirmed transaction.
	LagSeconds prometheus.GaugeFunc
	// StalledSeconds is computed at scrape time: see Stalled.
	StalledSeconds prometheus.GaugeFunc

	wm        atomic.Pointer[Tracked]  // the latest pipeline's
	lim       atomic.Pointer[Stalling] // the latest pipeline's
	isStandby atomic.Bool              // mirrors Standby
	// Rejects rate-limits the warnings about rejected messages.
	Rejects RejectLog
}

// Tracked is what the scrape-time gauges read from the latest CDC pipeline:
// its watermark.
type Tracked interface {
	// Confirmed is the position safe to confirm.
	Confirmed() pglogrepl.LSN
	// OldestCommitTime is the commit time of the oldest transaction not yet
	// confirmed (zero: none).
	OldestCommitTime() time.Time
}

// Stalling is what the stalled-seconds gauge reads from the latest
// pipeline: its in-flight limiter.
type Stalling interface {
	Stalled(now time.Time) time.Duration
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
		RejectedMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_rejected_messages_total", Help: "Logical decoding messages with outboxd's prefix not proven to come from outbox_emit (bad or missing MAC, not transactional, malformed): skipped, never published.",
		}, []string{"reason"}),
		ForeignMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_foreign_messages_total", Help: "Logical decoding messages with another prefix than outboxd's: their content was dropped unread as it arrived.",
		}),
		ForeignMessageBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_foreign_message_bytes_total", Help: "Content bytes of the logical decoding messages with another prefix than outboxd's, dropped unread.",
		}),
		BadEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_bad_events_total", Help: "Outbox rows and messages that cannot become a record (NULL value, bad headers, ...), by what happened: dead_lettered or halted.",
		}, []string{"outcome"}),
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
		CommitToReceive: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outboxd_commit_to_receive_seconds",
			Help:    "Time from the Postgres commit to outboxd reading the transaction off the replication connection, per event: the PostgreSQL side of outboxd_commit_to_ack_seconds (walsender, network).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		ProduceRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_produce_retries_total", Help: "Batches sent again after a retriable Kafka error (broker down, no leader, not enough replicas).",
		}, []string{"topic"}),
		ProduceRecovery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outboxd_produce_recovery_seconds",
			Help:    "Time a partition kept failing with retriable errors before Kafka acknowledged it again.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_pipeline_restarts_total", Help: "Pipeline restarts, by cause.",
		}, []string{"cause"}),
		ServerWALLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_server_wal_lsn", Help: "The server's current WAL position (pg_current_wal_lsn) at the last slot poll.",
		}),
		LagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_lag_bytes", Help: "Server WAL end minus the confirmed position (this process's or the slot's, whichever is ahead), at the last slot poll.",
		}),
		SlotRetainedWALBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_slot_retained_wal_bytes", Help: "WAL the server keeps for the slot (current WAL LSN minus restart_lsn), at the last slot poll.",
		}),
		SlotPolls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_slot_polls_total", Help: "Polls of pg_replication_slots, by result (ok, error).",
		}, []string{"result"}),
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_state", Help: "1 for what the process does now, 0 for the rest: starting, active (streaming or polling), standby, restarting, halted (stopped by an error an operator must fix), stopped.",
		}, []string{"state"}),
		LastEventTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_last_event_timestamp_seconds", Help: "Unix time Kafka last acknowledged an event published by this process; 0 before the first. time() minus it is the age of the last event.",
		}),
		SlotActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_slot_active", Help: "pg_replication_slots.active at the last slot poll: 1 while a process streams from the slot.",
		}),
		SlotWALStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_slot_wal_status", Help: "1 for the slot's wal_status at the last slot poll (reserved, extended, unreserved, lost; missing: no such slot), 0 for the others; all 0 before the first poll answered.",
		}, []string{"status"}),
		SlotSafeWALSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outboxd_slot_safe_wal_size_bytes", Help: "pg_replication_slots.safe_wal_size at the last slot poll: WAL that may still be written before the slot is at risk of being lost. Absent when PostgreSQL reports NULL (max_slot_wal_keep_size = -1, or the slot is lost).",
		}, nil),
	}
	m.Standby = standbyGauge{prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxd_standby", Help: "1 while another process holds the slot and this one waits.",
	}), &m.isStandby}
	m.StalledSeconds = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxd_stalled_seconds", Help: "How long events have been waiting for Kafka with none acknowledged; 0 when nothing waits. Alert when it stays above a few seconds: outboxd is stuck.",
	}, func() float64 { return m.Stalled(time.Now()).Seconds() })
	m.LagSeconds = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outboxd_lag_seconds", Help: "Now minus the commit time of the oldest transaction received and not yet confirmed; 0 when none (or standby).",
	}, func() float64 { return m.Lag(time.Now()).Seconds() })
	// Pre-create the label values dashboards and alerts expect, so the series
	// exist (at 0) before the first event.
	for _, c := range []string{"kafka", "postgres", "hook", "other"} {
		m.Restarts.WithLabelValues(c)
	}
	for _, r := range []string{"ok", "error"} {
		m.SlotPolls.WithLabelValues(r)
	}
	for _, st := range stateLabels {
		m.State.WithLabelValues(st)
	}
	m.State.WithLabelValues(stateLabel(StateStarting)).Set(1)
	for _, ws := range walStatuses {
		m.SlotWALStatus.WithLabelValues(ws)
	}
	if reg != nil {
		reg.MustRegister(m.Published, m.PublishedBytes, m.ProduceErrors, m.DeadLettered, m.RejectedMessages, m.ForeignMessages, m.ForeignMessageBytes, m.BadEvents,
			m.InFlightEvents, m.InFlightBytes, m.ConfirmedLSN, m.ReceivedLSN, m.CommitToAck, m.CommitToReceive,
			m.Restarts, m.Standby, m.ServerWALLSN, m.LagBytes, m.SlotRetainedWALBytes,
			m.SlotPolls, m.LagSeconds, m.ProduceRetries, m.ProduceRecovery, m.StalledSeconds,
			m.State, m.LastEventTimestamp, m.SlotActive, m.SlotWALStatus, m.SlotSafeWALSize)
	}
	return m
}

// ProducerHooks feed the producer metrics.
func (m *Metrics) ProducerHooks() kafka.ProducerHooks {
	return kafka.ProducerHooks{
		OnRetry: func(topic string, _ int32, _ int, _ error) { m.ProduceRetries.WithLabelValues(topic).Inc() },
		OnRecovered: func(_ string, _ int32, stalled time.Duration) {
			m.ProduceRecovery.Observe(stalled.Seconds())
		},
	}
}

// standbyGauge is the Standby gauge, also remembered for LagSeconds.
type standbyGauge struct {
	prometheus.Gauge
	on *atomic.Bool
}

func (g standbyGauge) Set(v float64) {
	g.on.Store(v != 0)
	g.Gauge.Set(v)
}

// Track makes wm, the watermark of a new pipeline, the one LagSeconds and
// Confirmed read. A pipeline that failed stays tracked until the next one
// starts: its oldest unconfirmed transaction keeps ageing while the service
// restarts, as it should.
func (m *Metrics) Track(wm Tracked) { m.wm.Store(&wm) }

// TrackStall makes l, the limiter of a new pipeline, the one Stalled reads.
func (m *Metrics) TrackStall(l Stalling) { m.lim.Store(&l) }

// Stalled is how long the latest pipeline has had events in flight with
// none acknowledged: zero when nothing is waiting, or Kafka keeps
// acknowledging. A value that keeps growing means stuck.
func (m *Metrics) Stalled(now time.Time) time.Duration {
	if l := m.lim.Load(); l != nil && !m.isStandby.Load() {
		return (*l).Stalled(now)
	}
	return 0
}

// Lag is now minus the commit time of the oldest transaction received and not
// yet confirmed: 0 when none is in flight, before the first pipeline and
// while standby.
func (m *Metrics) Lag(now time.Time) time.Duration {
	wm := m.wm.Load()
	if wm == nil || m.isStandby.Load() {
		return 0
	}
	t := (*wm).OldestCommitTime()
	if t.IsZero() || now.Before(t) {
		return 0
	}
	return now.Sub(t)
}

// Confirmed is the confirmed position of the latest pipeline, 0 before the
// first.
func (m *Metrics) Confirmed() pglogrepl.LSN {
	if wm := m.wm.Load(); wm != nil {
		return (*wm).Confirmed()
	}
	return 0
}

// stateLabels are outboxd_state's label values, indexed by State. The
// streaming state is "active": what an operator calls the instance that
// publishes, beside the standby.
var stateLabels = [...]string{
	StateStarting:   "starting",
	StateStreaming:  "active",
	StateStandby:    "standby",
	StateRestarting: "restarting",
	StateStopped:    "stopped",
	StateHalted:     "halted",
}

func stateLabel(st State) string { return stateLabels[st] }

// SetState makes st the one outboxd_state series at 1. The others are
// zeroed first: a scrape in the middle of a change may see none at 1, never
// two, so a sum over the states never counts one process twice.
func (m *Metrics) SetState(st State) {
	for i, l := range stateLabels {
		if State(i) != st {
			m.State.WithLabelValues(l).Set(0)
		}
	}
	m.State.WithLabelValues(stateLabel(st)).Set(1)
}

// walStatuses are outboxd_slot_wal_status's label values: PostgreSQL's
// wal_status values and "missing" for a slot that does not exist.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost", WALStatusMissing}

// WALStatusMissing is the wal_status the slot metrics report for a slot
// that is not in pg_replication_slots.
const WALStatusMissing = "missing"

// SlotPoll is one reading of the slot for the slot metrics.
type SlotPoll struct {
	// ServerWAL is the server's current WAL position.
	ServerWAL pglogrepl.LSN
	// SlotConfirmed is the slot's confirmed_flush_lsn; RestartLSN its
	// restart_lsn (0 when lost).
	SlotConfirmed, RestartLSN pglogrepl.LSN
	// Active is pg_replication_slots.active.
	Active bool
	// WALStatus is pg_replication_slots.wal_status ("" when NULL: then no
	// status series is at 1).
	WALStatus string
	// SafeWALSize is pg_replication_slots.safe_wal_size, nil when NULL.
	SafeWALSize *int64
}

// ObserveSlot sets the slot metrics from one poll. Lag is measured from
// whichever confirmed position is ahead: this process's watermark (exact,
// while it streams) or the slot's (which includes the keepalive positions an
// idle outbox confirms, and another instance's progress).
func (m *Metrics) ObserveSlot(p SlotPoll) {
	m.SlotPolls.WithLabelValues("ok").Inc()
	m.ServerWALLSN.Set(float64(p.ServerWAL))
	confirmed := max(m.Confirmed(), p.SlotConfirmed)
	m.LagBytes.Set(float64(slot.WALDistance(p.ServerWAL, confirmed)))
	m.SlotRetainedWALBytes.Set(float64(slot.WALDistance(p.ServerWAL, p.RestartLSN)))
	if p.Active {
		m.SlotActive.Set(1)
	} else {
		m.SlotActive.Set(0)
	}
	m.setWALStatus(p.WALStatus)
	if p.SafeWALSize != nil {
		m.SlotSafeWALSize.WithLabelValues().Set(float64(*p.SafeWALSize))
	} else {
		m.SlotSafeWALSize.Reset()
	}
}

// SlotMissing records a poll that found no slot: it is counted as an
// answered poll (PostgreSQL answered; the slot is gone), wal_status becomes
// "missing", and the gauges that describe a slot say none is there: not
// active, no safe WAL size. The WAL positions keep their last values.
func (m *Metrics) SlotMissing() {
	m.SlotPolls.WithLabelValues("ok").Inc()
	m.SlotActive.Set(0)
	m.setWALStatus(WALStatusMissing)
	m.SlotSafeWALSize.Reset()
}

func (m *Metrics) setWALStatus(status string) {
	for _, ws := range walStatuses {
		v := 0.0
		if ws == status {
			v = 1
		}
		m.SlotWALStatus.WithLabelValues(ws).Set(v)
	}
}

// SlotPollFailed counts a failed poll; the slot metrics keep their last values.
func (m *Metrics) SlotPollFailed() { m.SlotPolls.WithLabelValues("error").Inc() }

// ObserveLatency observes one event acknowledged: from its commit (or the
// row's creation) to now.
func (m *Metrics) ObserveLatency(commit time.Time) {
	m.CommitToAck.Observe(time.Since(commit).Seconds())
}

// rejectLogEvery bounds the warnings about rejected messages: whoever can
// emit them (any role, unless pg_logical_emit_message is revoked from
// PUBLIC) must not be able to flood the log.
const rejectLogEvery = 10 * time.Second

// RejectLog rate-limits the warnings about rejected messages. It outlives
// pipeline restarts: one per process, in Metrics.
type RejectLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether to log now, and how many were suppressed since the
// last warning.
func (l *RejectLog) Allow(now time.Time) (bool, int) {
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
