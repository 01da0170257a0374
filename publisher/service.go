package publisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// Source delivers committed outbox messages in commit order. It is satisfied
// by *replication.Stream.
type Source interface {
	// StartLSN is the slot's confirmed position the source starts after.
	StartLSN() pglogrepl.LSN
	// Run delivers messages to out and closes it when it stops reading
	// (ctx cancelled or failure); it keeps confirming progress.Confirmed()
	// until progress.Done() is closed.
	Run(ctx context.Context, out chan<- replication.Message, progress replication.Progress) error
	Close()
}

// Deps are the factories the service calls on every (re)start.
type Deps struct {
	// OpenSource connects to the slot. It returns an error wrapping
	// replication.ErrSlotInUse while another process holds it.
	OpenSource func(ctx context.Context) (Source, error)
	// NewProducer connects a producer.
	NewProducer func() (Producer, error)
	// NewDeadLetterer, when set, connects the dead-letter producer. If the
	// returned value is an io.Closer it is closed at the end of the session.
	NewDeadLetterer func() (DeadLetterer, error)
	// NewHook, when set, connects the post-publish hook; closed like the
	// dead-letterer.
	NewHook func(ctx context.Context) (Hook, error)
}

// State is what the service is doing, for health checks.
type State int32

const (
	StateStarting State = iota
	StateStreaming
	StateStandby
	StateRestarting
	StateStopped
)

func (s State) String() string {
	return [...]string{"starting", "streaming", "standby", "restarting", "stopped"}[s]
}

// Service runs pipelines one after another: it restarts after failures with
// capped exponential backoff, waits as a standby while another process holds
// the slot, and halts on a poison event or a broken outbox table.
type Service struct {
	cfg   Config
	log   *zap.Logger
	m     *Metrics
	deps  Deps
	state atomic.Int32
	// lastPID is the server process of the previous session's replication
	// connection, and progressed whether that session's pipeline delivered
	// anything (Run's goroutine only).
	lastPID    int
	progressed bool
}

// NewService builds a service. m may be nil.
func NewService(cfg Config, log *zap.Logger, m *Metrics, deps Deps) *Service {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Service{cfg: cfg, log: log, m: m, deps: deps}
}

// Stalled is how long the current session has had events waiting for Kafka
// with none acknowledged (see Metrics.Stalled).
func (s *Service) Stalled() time.Duration { return s.m.Stalled(time.Now()) }

// State reports what the service is doing.
func (s *Service) State() State { return State(s.state.Load()) }

func (s *Service) setState(st State) {
	s.state.Store(int32(st))
	if st == StateStandby {
		s.m.Standby.Set(1)
	} else {
		s.m.Standby.Set(0)
	}
}

// Run runs until ctx is cancelled (then returns nil after a graceful drain)
// or a fatal error: a poison event without a dead-letter topic, a missing
// slot, or an outbox table the decoder cannot read.
func (s *Service) Run(ctx context.Context) error {
	defer s.setState(StateStopped)
	backoff := NewBackoff(s.cfg.RestartBackoffMin, s.cfg.RestartBackoffMax)
	standbyPID := -1
	for {
		started := time.Now()
		err := s.session(ctx, &standbyPID)
		if ctx.Err() != nil {
			s.log.Info("stopped")
			return nil
		}
		var inUse *replication.SlotInUseError
		switch {
		case errors.As(err, &inUse) && inUse.PID != 0 && inUse.PID == s.lastPID:
			// Our own previous walsender has not exited yet: not a standby.
			if !Sleep(ctx, s.cfg.RestartBackoffMin) {
				return nil
			}
			continue
		case errors.As(err, &inUse):
			if inUse.PID != standbyPID {
				s.log.Info("standby: another process holds the slot; waiting to take over",
					zap.String("slot", inUse.Slot), zap.Int("active_pid", inUse.PID))
				standbyPID = inUse.PID
			}
			s.setState(StateStandby)
			if !Sleep(ctx, s.cfg.StandbyPollInterval) {
				return nil
			}
			continue
		case isFatal(err):
			s.log.Error("halting", zap.Error(err))
			return err
		}
		cause := restartCause(err)
		s.m.Restarts.WithLabelValues(cause).Inc()
		if s.progressed {
			// The session delivered events: this failure is a new one, not
			// the same outage again, so it does not inherit the backoff.
			backoff.Reset()
		}
		wait := backoff.Next(time.Since(started))
		s.setState(StateRestarting)
		s.log.Warn("restarting pipeline from the last confirmed position",
			zap.String("cause", cause), zap.Duration("backoff", wait), zap.Error(err))
		if !Sleep(ctx, wait) {
			return nil
		}
	}
}

func isFatal(err error) bool {
	return errors.Is(err, ErrPoison) ||
		errors.Is(err, replication.ErrSlotMissing) ||
		errors.Is(err, replication.ErrMissingColumn) ||
		errors.Is(err, replication.ErrBadValue)
}

func restartCause(err error) string {
	switch {
	case errors.Is(err, ErrProduce), errors.Is(err, errProducerOpen):
		return "kafka"
	case errors.Is(err, errSourceOpen), errors.Is(err, errSource):
		return "postgres"
	case errors.Is(err, ErrHook):
		return "hook"
	default:
		return "other"
	}
}

var (
	errProducerOpen = errors.New("open producer")
	errSourceOpen   = errors.New("open replication stream")
	errSource       = errors.New("replication stream")
)

// session is one pipeline run: open the slot, open the producer, stream.
func (s *Service) session(ctx context.Context, standbyPID *int) error {
	s.progressed = false
	src, err := s.deps.OpenSource(ctx)
	if err != nil {
		if errors.Is(err, replication.ErrSlotInUse) || isFatal(err) {
			return err
		}
		return fmt.Errorf("%w: %w", errSourceOpen, err)
	}
	defer src.Close()
	if p, ok := src.(interface{ BackendPID() int }); ok {
		s.lastPID = p.BackendPID()
	}
	if *standbyPID >= 0 {
		s.log.Info("taking over: the slot is free", zap.Int("previous_pid", *standbyPID))
		*standbyPID = -1
	}

	prod, err := s.deps.NewProducer()
	if err != nil {
		return fmt.Errorf("%w: %w", errProducerOpen, err)
	}
	var dlq DeadLetterer
	if s.deps.NewDeadLetterer != nil {
		if dlq, err = s.deps.NewDeadLetterer(); err != nil {
			prod.Close()
			drainResults(prod)
			return fmt.Errorf("%w: %w", errProducerOpen, err)
		}
		if c, ok := dlq.(io.Closer); ok {
			defer c.Close()
		}
	}

	var hook Hook
	if s.deps.NewHook != nil {
		if hook, err = s.deps.NewHook(ctx); err != nil {
			prod.Close()
			drainResults(prod)
			return fmt.Errorf("%w: %w", ErrHook, err)
		}
		if c, ok := hook.(io.Closer); ok {
			defer c.Close()
		}
	}

	pl := NewPipeline(s.cfg, s.log, prod, dlq, hook, src.StartLSN(), s.m)
	s.m.ConfirmedLSN.Set(float64(src.StartLSN()))

	// Two contexts: cancelling readCtx stops reading from the slot;
	// cancelling hardCtx abandons the wait for in-flight acknowledgements.
	readCtx, cancelRead := context.WithCancel(ctx)
	defer cancelRead()
	hardCtx, cancelHard := context.WithCancel(context.Background())
	defer cancelHard()
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			s.log.Info("shutting down: waiting for in-flight acknowledgements",
				zap.Duration("timeout", s.cfg.ShutdownTimeout))
			t := time.NewTimer(s.cfg.ShutdownTimeout)
			defer t.Stop()
			select {
			case <-t.C:
				s.log.Warn("shutdown timeout: unacknowledged events will be sent again after restart")
				cancelHard()
			case <-finished:
			}
		case <-finished:
		}
	}()

	out := make(chan replication.Message, 1024)
	streamErr := make(chan error, 1)
	go func() { streamErr <- src.Run(readCtx, out, pl) }()
	s.setState(StateStreaming)

	plErr := pl.Run(hardCtx, out)
	s.progressed = pl.Progressed()
	if plErr != nil {
		cancelRead() // stop reading; the stream still confirms what was acked
		if ctx.Err() == nil {
			// Not ready from now on: closing a producer whose broker is gone
			// can take its whole retry budget.
			s.setState(StateRestarting)
		}
	}
	prod.Close()
	drainResults(prod)
	sErr := <-streamErr
	if plErr != nil && !errors.Is(plErr, context.Canceled) {
		return plErr
	}
	if sErr != nil {
		if isFatal(sErr) {
			return sErr
		}
		return fmt.Errorf("%w: %w", errSource, sErr)
	}
	return plErr
}

// drainResults waits for a closed producer to hand back what it had in
// flight; those records are neither acked nor confirmed.
func drainResults(p Producer) {
	for range p.Results() {
	}
}
