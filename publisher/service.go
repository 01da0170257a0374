package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Source delivers committed outbox messages in commit order. It is satisfied
// by *replication.Stream.
type Source interface {
	// StartLSN is the slot's confirmed position the source starts after.
	StartLSN() pglogrepl.LSN
	// System is the server's system identifier, timeline and database.
	System() (systemID string, timeline int32, database string, databaseOID uint32)
	// Slot is the slot's name.
	Slot() string
	// BackendPID is the server process of the replication connection.
	BackendPID() int
	// Run delivers messages to out and closes it when it stops
	// reading (ctx cancelled or failure); it keeps confirming what gate
	// says may be confirmed until gate.Done() is closed, and takes room
	// from budget for every event it hands over.
	Run(ctx context.Context, out chan<- replication.Message, gate replication.Gate, budget replication.Budget) error
	Close()
}

// Deps are the factories the service calls on every (re)start.
type Deps struct {
	// OpenSource connects to the slot. It returns an error wrapping
	// replication.ErrSlotInUse while another process holds it.
	OpenSource func(ctx context.Context) (Source, error)
	// NewProducer connects a producer for the identity's slot (in
	// exactly-once mode with the identity's transactional id, which fences
	// any older producer of the same slot).
	NewProducer func(id Identity) (outbox.Producer, error)
	// ReadCheckpoint, when set, reads the identity's checkpoint (nil when
	// there is none yet): checkpoints are on. The session writes a read
	// barrier to the checkpoint topic first (writeReadBarrier) and passes
	// where it landed: the read must reach past it (kafka.ReadCompacted).
	ReadCheckpoint func(ctx context.Context, id Identity, barrier []kafka.Barrier) (*Checkpoint, error)
	// ReadSlotHolder, when set, returns the server process holding the
	// slot (0: none). A session with checkpoints asks it once its read
	// barrier was acknowledged: only while the slot is still its own
	// walsender's (Source.BackendPID) is the barrier's offset its epoch
	// (Identity.Epoch), below every later owner's.
	ReadSlotHolder func(ctx context.Context) (pid int, err error)
	// EnsureCheckpointTopic, when set, creates the checkpoint topic when it
	// is missing, before the session writes its read barrier there.
	EnsureCheckpointTopic func() error
	// NewDeadLetterer, when set, connects the dead-letter producer. If the
	// returned value is an io.Closer it is closed at the end of the session.
	NewDeadLetterer func() (outbox.DeadLetterer, error)
	// NewHook, when set, connects the post-publish hook; closed like the
	// dead-letterer.
	NewHook func(ctx context.Context) (outbox.Hook, error)
	// ReadHistory, when set, reads the server's WAL history: a checkpoint
	// not on it (the database went back in time) is refused with a
	// *RewindError instead of skipping what it covers.
	ReadHistory func(ctx context.Context) (*replication.History, error)
	// AwaitSlotRelease, when set, returns once process pid no longer holds
	// the slot (see outbox.SupervisorConfig.AwaitRelease): a standby takes
	// over as soon as the active process is gone.
	AwaitSlotRelease func(ctx context.Context, slot string, pid int) error
	// SlotCreated says this process created the slot before its first
	// session: a slot created below the checkpoint proves a rewind.
	SlotCreated bool
}

// Service is the CDC source under a Supervisor: each session opens the
// slot, the producer and a pipeline; the supervisor restarts failed sessions
// with backoff, waits as a standby while another process holds the slot, and
// halts on a poison event or a broken outbox table.
type Service struct {
	cfg  Config
	log  *zap.Logger
	m    *outbox.Metrics
	deps Deps
	sup  *outbox.Supervisor
	// lastPID is the server process of the previous session's replication
	// connection (the supervisor's goroutine only).
	lastPID int
	// newSlot: the slot was created by this process and no session has
	// streamed from it yet (the supervisor's goroutine only).
	newSlot bool
}

// NewService builds a service. m may be nil.
func NewService(cfg Config, log *zap.Logger, m *outbox.Metrics, deps Deps) *Service {
	if m == nil {
		m = outbox.NewMetrics(nil)
	}
	s := &Service{cfg: cfg, log: log, m: m, deps: deps, newSlot: deps.SlotCreated}
	s.sup = outbox.NewSupervisor(outbox.SupervisorConfig{
		RestartBackoffMin:   cfg.RestartBackoffMin,
		RestartBackoffMax:   cfg.RestartBackoffMax,
		StandbyPollInterval: cfg.StandbyPollInterval,
		AwaitRelease:        deps.AwaitSlotRelease,
		ShutdownTimeout:     cfg.ShutdownTimeout,
		Cause:               restartCause,
	}, log, m)
	return s
}

// Stalled is how long the current session has had events waiting for Kafka
// with none acknowledged (see Metrics.Stalled).
func (s *Service) Stalled() time.Duration { return s.m.Stalled(time.Now()) }

// State reports what the service is doing.
func (s *Service) State() outbox.State { return s.sup.State() }

// Run runs until ctx is cancelled (then returns nil after a graceful drain)
// or a fatal error: a poison event without a dead-letter topic, a missing
// slot, or an outbox table the decoder cannot read.
func (s *Service) Run(ctx context.Context) error { return s.sup.Run(ctx, s.session) }

func restartCause(err error) string {
	switch {
	case errors.Is(err, kafka.ErrProduce), errors.Is(err, errProducerOpen):
		return "kafka"
	case errors.Is(err, errSourceOpen), errors.Is(err, errSource):
		return "postgres"
	case errors.Is(err, outbox.ErrHook):
		return "hook"
	case errors.Is(err, errEncode):
		return "format"
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
func (s *Service) session(ctx, hardCtx context.Context) (progressed bool, err error) {
	src, err := s.openSource(ctx)
	if err != nil {
		return false, err
	}
	defer src.Close()
	s.lastPID = src.BackendPID()

	sysID, timeline, db, dbOID := src.System()
	id := Identity{SystemID: sysID, Timeline: timeline, Database: db, DatabaseOID: dbOID, Slot: src.Slot()}
	// The producer first: in exactly-once mode it fences every older
	// producer of this slot and aborts its open transaction, so the
	// checkpoint read next is final.
	prod, err := s.deps.NewProducer(id)
	if err != nil {
		if errors.Is(err, kafka.ErrFenced) {
			return false, err
		}
		return false, fmt.Errorf("%w: %w", errProducerOpen, err)
	}
	pl, closeDeps, err := s.newPipeline(ctx, src, prod, id)
	if err != nil {
		prod.Close()
		drainResults(prod)
		return false, err
	}
	defer closeDeps()
	return s.stream(ctx, hardCtx, src, prod, pl)
}

// openSource connects to the slot. Our own previous walsender still
// holding it is retried soon, not waited for as a standby.
func (s *Service) openSource(ctx context.Context) (Source, error) {
	src, err := s.deps.OpenSource(ctx)
	if err == nil {
		return src, nil
	}
	var inUse *replication.SlotInUseError
	if errors.As(err, &inUse) && inUse.PID != 0 && inUse.PID == s.lastPID {
		// Our own previous walsender has not exited yet: not a standby.
		s.log.Debug("the slot is still held by our previous session's walsender; retrying", zap.Int("pid", inUse.PID))
		return nil, fmt.Errorf("%w: %w", outbox.ErrRetrySoon, err)
	}
	if errors.Is(err, replication.ErrSlotInUse) || halt.Is(err) {
		return nil, err
	}
	return nil, fmt.Errorf("%w: %w", errSourceOpen, err)
}

// newPipeline builds the session's pipeline: its delivery mode (from the
// checkpoint, when checkpoints are on), dead-letterer and hook. closeDeps
// closes the last two; on an error they are closed already.
func (s *Service) newPipeline(ctx context.Context, src Source, prod outbox.Producer, id Identity) (pl *Pipeline, closeDeps func(), err error) {
	var closers outbox.Closers
	defer func() {
		if err != nil {
			closers.CloseAll()
		}
	}()
	var cp *checkpointing
	if s.deps.ReadCheckpoint != nil {
		if cp, err = s.checkpointing(ctx, src, prod, id); err != nil {
			return nil, nil, err
		}
	}
	var dlq outbox.DeadLetterer
	if s.deps.NewDeadLetterer != nil {
		if dlq, err = s.deps.NewDeadLetterer(); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errProducerOpen, err)
		}
		closers.Add(dlq)
	}
	var hook outbox.Hook
	if s.deps.NewHook != nil {
		if hook, err = s.deps.NewHook(ctx); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", outbox.ErrHook, err)
		}
		closers.Add(hook)
	}
	pl = NewPipeline(s.cfg, s.log, prod, dlq, hook, src.StartLSN(), s.m)
	if cp != nil {
		if err = pl.useCheckpoints(cp); err != nil {
			return nil, nil, err
		}
	}
	return pl, closers.CloseAll, nil
}

// stream runs the stream and the pipeline until the pipeline returns, then
// ends the producer (aborting an open Kafka transaction first) and waits
// for the stream's last status update.
func (s *Service) stream(ctx, hardCtx context.Context, src Source, prod outbox.Producer, pl *Pipeline) (progressed bool, err error) {
	s.m.ConfirmedLSN.Set(float64(src.StartLSN()))

	// Cancelling readCtx stops reading from the slot (a stop, or a failed
	// pipeline); hardCtx, cancelled by the supervisor's shutdown watchdog,
	// abandons the wait for in-flight acknowledgements.
	readCtx, cancelRead := context.WithCancel(ctx)
	defer cancelRead()

	out := make(chan replication.Message, 1024)
	streamErr := make(chan error, 1)
	go func() { streamErr <- src.Run(readCtx, out, pl.Gate(), pl) }()
	s.sup.Running()

	plErr := pl.Run(hardCtx, out)
	progressed = pl.Progressed()
	if plErr != nil {
		cancelRead() // stop reading; the stream still confirms what was acked
		if ctx.Err() == nil {
			s.sup.NotRunning()
		}
	}
	abortErr := pl.mode.abort()
	prod.Close()
	drainResults(prod)
	sErr := <-streamErr
	switch {
	case abortErr != nil:
		return progressed, abortErr
	case plErr != nil && !errors.Is(plErr, context.Canceled) && !(errors.Is(plErr, errStreamCut) && sErr != nil):
		// A cut stream's cause is the stream's error, below.
		return progressed, plErr
	case sErr != nil && halt.Is(sErr):
		return progressed, sErr
	case sErr != nil:
		return progressed, fmt.Errorf("%w: %w", errSource, sErr)
	}
	return progressed, plErr
}

// checkpointing reads the identity's checkpoint and checks the slot against
// it: a checkpoint not on the server's history is refused (and the refusal
// recorded), a gap refused unless accepted. It returns the session's
// checkpoint state.
func (s *Service) checkpointing(ctx context.Context, src Source, prod outbox.Producer, id Identity) (*checkpointing, error) {
	if s.deps.EnsureCheckpointTopic != nil {
		if err := s.deps.EnsureCheckpointTopic(); err != nil {
			return nil, fmt.Errorf("%w: %w", errProducerOpen, err)
		}
	}
	barrier, epoch, err := writeReadBarrier(ctx, prod, s.cfg, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errProducerOpen, err)
	}
	// The session's epoch: every record it writes to the checkpoint topic
	// is under it, and readers take the highest. It holds only if no one
	// took the slot over before the barrier landed — an instance paused
	// between START_REPLICATION and the barrier's acknowledgement, whose
	// walsender ended meanwhile, would otherwise write under an epoch above
	// the new owner's. Past this check, any later owner's barrier, written
	// once it holds the slot, lands after this one.
	if err := s.checkSlotHolder(ctx, src); err != nil {
		return nil, err
	}
	id.Epoch = epoch
	c, err := s.deps.ReadCheckpoint(ctx, id, barrier)
	var keys []string // the identity's keys the read found, to tombstone
	if c != nil {
		keys = c.keys
	}
	if err == nil && c != nil && c.DatabaseOID != 0 && id.DatabaseOID != 0 && c.DatabaseOID != id.DatabaseOID {
		// A database of that name was dropped and created anew: its
		// outbox is another one, and the checkpoint is history.
		s.log.Info("the checkpoint is of an earlier database of the same name: starting fresh",
			zap.Uint32("checkpoint_database_oid", c.DatabaseOID), zap.Uint32("database_oid", id.DatabaseOID))
		c = nil
	}
	// The history first: a rewind is refused even with --accept-gap,
	// which accepts a gap on the checkpoint's history only.
	if err == nil && c != nil && s.deps.ReadHistory != nil {
		err = s.checkHistory(ctx, c, src)
		var rw *RewindError
		if errors.As(err, &rw) {
			if rerr := s.recordRefusal(ctx, prod, id, rw); rerr != nil {
				s.log.Warn("could not record the refusal in the checkpoint", zap.Error(rerr))
			}
		}
	}
	if err == nil {
		err = checkGap(c, id, src.StartLSN(), s.cfg.CheckpointTopic)
	}
	written := false // the session's epoch holds c
	if errors.Is(err, ErrGap) && s.cfg.AcceptGap {
		// Accepted once: the checkpoint starts over at the slot, so
		// later sessions check against it again.
		s.log.Warn("accepting the gap (--accept-gap): the checkpoint starts over at the slot's position", zap.Error(err))
		err = resetCheckpoint(ctx, prod, s.cfg, id, src.StartLSN(), c)
		c = &Checkpoint{EndLSN: src.StartLSN(), MaxOutboxID: c.MaxOutboxID, Generation: c.Generation}
		if err == nil {
			s.cfg.AcceptGap = false
			written = true
		}
	}
	if err != nil {
		if errors.Is(err, ErrGap) || errors.Is(err, ErrRewind) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: read checkpoint: %w", errProducerOpen, err)
	}
	if c != nil {
		if err := takeEpoch(ctx, prod, s.cfg, id, c, written, keys); err != nil {
			return nil, fmt.Errorf("%w: %w", errProducerOpen, err)
		}
	}
	if c != nil && c.EndLSN > src.StartLSN() {
		s.log.Info("resuming from the checkpoint: transactions before it are in Kafka already and are skipped",
			zap.Stringer("checkpoint", c.EndLSN), zap.Stringer("slot_confirmed", src.StartLSN()))
	}
	cp := newCheckpointing(s.cfg.CheckpointTopic, id, c, src.StartLSN())
	if !s.cfg.Mapping.SendsOrigin() {
		cp.origin = nil
	}
	s.newSlot = false
	return cp, nil
}

// ErrSlotTakenOver means another process took the slot over while this
// session set up: it was paused (a stop signal, a long GC, a frozen VM)
// past wal_sender_timeout, and the server ended its walsender. The session
// writes nothing under its epoch and restarts — a standby while the other
// holds the slot.
var ErrSlotTakenOver = errors.New("the slot was taken over while this session set up")

// checkSlotHolder checks that the slot is still held by the session's own
// walsender (Deps.ReadSlotHolder). A failed read is a restart too: the
// epoch is not proven.
func (s *Service) checkSlotHolder(ctx context.Context, src Source) error {
	if s.deps.ReadSlotHolder == nil {
		return nil
	}
	pid, err := s.deps.ReadSlotHolder(ctx)
	if err != nil {
		return fmt.Errorf("%w: check that the slot is still this session's after the checkpoint read barrier: %w", errSourceOpen, err)
	}
	if own := src.BackendPID(); pid != own {
		holder := fmt.Sprintf("held by server process %d", pid)
		if pid == 0 {
			holder = "held by no process"
		}
		return fmt.Errorf("%w: %w: replication slot %q is %s, not by this session's walsender (process %d): this instance was paused past wal_sender_timeout and another took the slot over; writing no checkpoint and starting again (a standby while the other holds it)",
			errSourceOpen, ErrSlotTakenOver, src.Slot(), holder, own)
	}
	return nil
}

// checkHistory reads the server's history and checks the checkpoint is on
// it. An error reading it is a restart (errSourceOpen), never a skip.
func (s *Service) checkHistory(ctx context.Context, c *Checkpoint, src Source) error {
	h, err := s.deps.ReadHistory(ctx)
	if err != nil {
		return fmt.Errorf("%w: read the server's WAL history: %w", errSourceOpen, err)
	}
	// The history comes over a connection of its own: during a failover a
	// DNS name, a VIP or a multi-host DSN can take it to another server
	// than the stream's. Judge only the stream's server's history.
	if sysID, tli, _, _ := src.System(); h.SystemID != sysID || h.Timeline != tli {
		return fmt.Errorf("%w: the WAL history was read from another server (system %s timeline %d) than the stream's (system %s timeline %d): a failover under way; trying again",
			errSourceOpen, h.SystemID, h.Timeline, sysID, tli)
	}
	return checkHistory(c, h, src.StartLSN(), s.newSlot, s.cfg.CheckpointTopic)
}

// recordRefusal writes the refusal into the checkpoint (same position,
// history and id high mark), so that every later start refuses too, even
// once the server's WAL has moved past the checkpoint or the slot created
// below it is no longer new.
func (s *Service) recordRefusal(ctx context.Context, prod outbox.Producer, id Identity, e *RewindError) error {
	if e.Kind == RewindRecorded {
		return nil
	}
	cp := e.Checkpoint
	cp.Refused = e.Error()
	id.Timeline = cp.Timeline
	return writeCheckpoint(ctx, prod, s.cfg, id, cp)
}

// drainResults waits for a closed producer to hand back what it had in
// flight; those records are neither acked nor confirmed.
func drainResults(p outbox.Producer) {
	for range p.Results() {
	}
}
