package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/halt"
)

// State is what a supervised source is doing, for health checks.
type State int32

const (
	StateStarting State = iota
	// StateStreaming: a session runs and delivers events (for the poller:
	// it polls).
	StateStreaming
	StateStandby
	StateRestarting
	StateStopped
	// StateHalted: Run returned an error that halts (halt.Is). Kept apart
	// from StateStopped because an operator must act on it, and a graceful
	// stop needs nothing.
	StateHalted
)

func (s State) String() string {
	return [...]string{"starting", "streaming", "standby", "restarting", "stopped", "halted"}[s]
}

// SupervisorConfig tunes a Supervisor.
type SupervisorConfig struct {
	// RestartBackoffMin and RestartBackoffMax bound the exponential backoff
	// (with jitter) between sessions after an error.
	RestartBackoffMin time.Duration
	RestartBackoffMax time.Duration
	// StandbyPollInterval is how often a standby tries to take over.
	StandbyPollInterval time.Duration
	// AwaitRelease, when set, returns once the process pid no longer holds
	// name, or with ctx's error: a standby then tries at once instead of
	// waiting out StandbyPollInterval, which still bounds each wait.
	AwaitRelease func(ctx context.Context, name string, pid int) error
	// ShutdownTimeout bounds a session's drain after a graceful stop.
	ShutdownTimeout time.Duration
	// Cause names an error's restart cause for the log and for the
	// outboxd_pipeline_restarts_total{cause} metric.
	Cause func(error) string
}

// A Session is one run of a source: its connections, its producer, its
// goroutines. It returns when it failed, or when stop was cancelled and it
// finished what it had in hand; hard is cancelled ShutdownTimeout after
// stop, and then the session abandons what is still in flight. It reports
// whether it delivered anything, which resets the restart backoff.
type Session func(stop, hard context.Context) (progressed bool, err error)

// Supervisor runs the sessions of one source one after another. It owns
// everything about a session's life that both sources (CDC and polling)
// share: the restart loop with backoff and jitter, waiting as a standby while
// another process holds the slot, the shutdown watchdog, the state for
// readiness and the restart-cause metric. A source only says how one
// session starts and runs.
//
// It decides what to do about a session's error once, from the error alone,
// and knows no source's types:
//
//   - an error that halts (halt.Is: a poison event, a missing slot, an
//     unreadable table) halts the source: Run returns it;
//   - an error implementing Held waits as a standby (another process holds
//     the slot);
//   - ErrRetrySoon starts the next session soon, without counting a restart;
//   - anything else restarts the session with backoff.
type Supervisor struct {
	cfg   SupervisorConfig
	log   *zap.Logger
	m     *Metrics
	state atomic.Int32
	// standbyPID is the process holding the slot while we wait as a
	// standby, -1 when not waiting (Run's goroutine only).
	standbyPID int
}

// Held is implemented by an error saying that another process holds what a
// session needs (for the CDC source, the replication slot): the supervisor
// waits as a standby, polling every StandbyPollInterval, instead of
// restarting. HeldBy names the thing held and the holder's process id.
type Held interface {
	error
	HeldBy() (name string, pid int)
}

// ErrRetrySoon asks for a new session after RestartBackoffMin, without
// counting or logging a restart.
var ErrRetrySoon = errors.New("retry soon")

// NewSupervisor builds a supervisor. m may be nil.
func NewSupervisor(cfg SupervisorConfig, log *zap.Logger, m *Metrics) *Supervisor {
	if m == nil {
		m = NewMetrics(nil)
	}
	if cfg.Cause == nil {
		cfg.Cause = func(error) string { return "other" }
	}
	return &Supervisor{cfg: cfg, log: log, m: m, standbyPID: -1}
}

// State reports what the source is doing.
func (s *Supervisor) State() State { return State(s.state.Load()) }

func (s *Supervisor) setState(st State) {
	s.state.Store(int32(st))
	s.m.SetState(st)
	if st == StateStandby {
		s.m.Standby.Set(1)
	} else {
		s.m.Standby.Set(0)
	}
}

// Running is called by a session once it runs: the state becomes
// streaming, and a standby that just took over says so.
func (s *Supervisor) Running() {
	if s.standbyPID >= 0 {
		s.log.Info("taking over: the slot is free", zap.Int("previous_pid", s.standbyPID))
		s.standbyPID = -1
	}
	s.setState(StateStreaming)
}

// NotRunning is called by a session that failed and is winding down: not
// ready from now on (closing a producer whose broker is gone can take a
// while).
func (s *Supervisor) NotRunning() { s.setState(StateRestarting) }

// Run runs sessions until ctx is cancelled (then returns nil after the last
// session drained) or a session fails with a fatal error (returned).
func (s *Supervisor) Run(ctx context.Context, session Session) (err error) {
	defer func() {
		if halt.Is(err) {
			s.setState(StateHalted)
		} else {
			s.setState(StateStopped)
		}
	}()
	bo := backoff.New(s.cfg.RestartBackoffMin, s.cfg.RestartBackoffMax)
	for {
		started := time.Now()
		progressed, err := s.runSession(ctx, session)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				// A failure while finishing: never dropped silently.
				if halt.Is(err) {
					s.log.Error("halting", zap.Error(err))
					return err
				}
				s.log.Warn("the last session failed while stopping: what was not acknowledged is sent again after a restart", zap.Error(err))
			}
			s.log.Info("stopped")
			return nil
		}
		var held Held
		switch {
		case errors.Is(err, ErrRetrySoon):
			if !backoff.Sleep(ctx, s.cfg.RestartBackoffMin) {
				return nil
			}
			continue
		case errors.As(err, &held):
			if slot, pid := held.HeldBy(); pid != s.standbyPID {
				s.log.Info("standby: another process holds the slot; waiting to take over",
					zap.String("slot", slot), zap.Int("active_pid", pid))
				s.standbyPID = pid
			}
			s.setState(StateStandby)
			if !s.awaitTakeover(ctx, held) {
				return nil
			}
			continue
		case halt.Is(err):
			s.log.Error("halting", zap.Error(err))
			return err
		}
		cause := s.cfg.Cause(err)
		s.m.Restarts.WithLabelValues(cause).Inc()
		if progressed {
			// The session delivered events: this failure is a new one, not
			// the same outage again, so it does not inherit the backoff.
			bo.Reset()
		}
		wait := bo.Next(time.Since(started))
		s.setState(StateRestarting)
		s.log.Warn("restarting pipeline from the last confirmed position",
			zap.String("cause", cause), zap.Duration("backoff", wait), zap.Error(err))
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// runSession runs one session with its two contexts and the shutdown
// watchdog that cancels hard ShutdownTimeout after ctx is cancelled.
func (s *Supervisor) runSession(ctx context.Context, session Session) (bool, error) {
	hard, cancelHard := context.WithCancel(context.Background())
	defer cancelHard()
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			s.log.Info("shutting down: finishing what is in flight", zap.Duration("timeout", s.cfg.ShutdownTimeout))
			t := time.NewTimer(s.cfg.ShutdownTimeout)
			defer t.Stop()
			select {
			case <-t.C:
				s.log.Warn("shutdown timeout: what was not acknowledged is sent again after restart")
				cancelHard()
			case <-finished:
			}
		case <-finished:
		}
	}()
	return session(ctx, hard)
}

// awaitTakeover waits as a standby until the next try: a jittered
// StandbyPollInterval, or less when AwaitRelease sees the holder let go. It
// reports false when ctx ended.
func (s *Supervisor) awaitTakeover(ctx context.Context, held Held) bool {
	wait := backoff.Jitter(s.cfg.StandbyPollInterval)
	if s.cfg.AwaitRelease == nil {
		return backoff.Sleep(ctx, wait)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	name, pid := held.HeldBy()
	if err := s.cfg.AwaitRelease(wctx, name, pid); err != nil && wctx.Err() == nil {
		// The check itself failed (say, a lost connection): wait the
		// interval out as without one.
		s.log.Debug("standby: checking whether the slot is free failed", zap.Error(err))
		<-wctx.Done()
	}
	return ctx.Err() == nil
}
