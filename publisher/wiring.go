package publisher

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

// standbyCheckInterval is how often a standby reads pg_replication_slots
// while it waits: it takes over within that of the active process's exit
// (Config.StandbyPollInterval still bounds each wait and retries the slot).
const standbyCheckInterval = 100 * time.Millisecond

// Wiring is what NewKafkaService connects a Service to besides its Config:
// the slot's replication stream and the Kafka cluster.
type Wiring struct {
	// Stream is the replication connection every session opens.
	Stream replication.StreamConfig
	// Kafka is the cluster. NewKafkaService sets its ContinueAfterPoison
	// from Config.DeadLetterTopic (a poison record then fails alone, for
	// the dead-letter topic) and Config.MaxRecordBytes from its
	// MaxMessageBytes.
	Kafka kafka.Config
	// NewHook, when set, is Deps.NewHook.
	NewHook func(ctx context.Context) (outbox.Hook, error)
	// SlotCreated is Deps.SlotCreated (checked against a checkpoint, so
	// only with Config.CheckpointTopic).
	SlotCreated bool
}

// NewKafkaService is the CDC service that outboxd run starts (and the
// bench measures in-process): sessions read w.Stream (replication.Open)
// and send with a kafka.Producer, in exactly-once mode one with the
// identity's transactional id. With cfg.CheckpointTopic set, every session
// reads its checkpoint from that compacted topic and the server's WAL
// history to check it against; with cfg.DeadLetterTopic set, poison events
// go there. m may be nil (no metrics).
func NewKafkaService(cfg Config, w Wiring, log *zap.Logger, m *outbox.Metrics) *Service {
	kcfg := w.Kafka
	kcfg.ContinueAfterPoison = cfg.DeadLetterTopic != ""
	// The encoded copies of the budget's records in produce requests are
	// bounded by half the budget (README "Memory").
	kcfg.EncodedBytes = int(min(cfg.MaxInFlightBytes/2, int64(kcfg.MaxRequestBytes)))
	cfg.MaxRecordBytes = kcfg.MaxMessageBytes
	hooks := kafka.ProducerHooks{}
	stream := w.Stream
	if stream.MaxMessageBytes == 0 {
		// An outbox_emit message larger than a record can be is not held.
		stream.MaxMessageBytes = kcfg.MaxMessageBytes
	}
	if m != nil {
		hooks = m.ProducerHooks()
		stream.OnForeignMessage = func(f replication.ForeignMessage) {
			m.ForeignMessages.Inc()
			m.ForeignMessageBytes.Add(float64(f.Size))
		}
	}
	deps := Deps{
		OpenSource: func(ctx context.Context) (Source, error) {
			return replication.Open(ctx, stream, log.Named("replication"))
		},
		NewProducer: func(id Identity) (outbox.Producer, error) {
			c := kcfg
			if cfg.Delivery == ExactlyOnce {
				c.TransactionalID = id.TransactionalID()
			}
			return kafka.NewProducer(c, log.Named("kafka"), hooks)
		},
		AwaitSlotRelease: func(ctx context.Context, name string, pid int) error {
			conn, err := pgx.Connect(ctx, w.Stream.ConnString)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			return slot.AwaitRelease(ctx, conn, name, pid, standbyCheckInterval)
		},
		NewHook: w.NewHook,
	}
	if topic := cfg.CheckpointTopic; topic != "" {
		deps.ReadCheckpoint = func(ctx context.Context, id Identity, barrier []kafka.Barrier) (*Checkpoint, error) {
			began := time.Now()
			c, err := readCheckpoint(ctx, kcfg, topic, id, barrier...)
			if err == nil {
				// How long a session's start waited for the checkpoint: on a
				// shared cluster, what other deployments cannot stretch.
				log.Info("checkpoint read", zap.String("topic", topic), zap.Bool("found", c != nil),
					zap.Duration("took", time.Since(began).Round(time.Millisecond)))
			}
			return c, err
		}
		deps.EnsureCheckpointTopic = func() error { return kafka.EnsureCompactedTopic(kcfg, topic) }
		deps.ReadSlotHolder = func(ctx context.Context) (int, error) { return replication.ReadSlotHolder(ctx, w.Stream) }
		deps.ReadHistory = func(ctx context.Context) (*replication.History, error) {
			return replication.ReadServerHistory(ctx, w.Stream)
		}
		deps.SlotCreated = w.SlotCreated
	}
	if topic := cfg.DeadLetterTopic; topic != "" {
		deps.NewDeadLetterer = func() (outbox.DeadLetterer, error) {
			return kafka.NewDeadLetterer(kcfg, topic)
		}
	}
	return NewService(cfg, log, m, deps)
}

// ReadCheckpoint reads id's checkpoint from the compacted topic (nil when
// there is none): the latest of its highest epoch (PickCheckpoint). It
// creates the topic when it is missing, and reads past barrier, when given
// (see kafka.ReadCompacted).
func ReadCheckpoint(ctx context.Context, kcfg kafka.Config, topic string, id Identity, barrier ...kafka.Barrier) (*Checkpoint, error) {
	if err := kafka.EnsureCompactedTopic(kcfg, topic); err != nil {
		return nil, err
	}
	return readCheckpoint(ctx, kcfg, topic, id, barrier...)
}

// readCheckpoint is ReadCheckpoint on a topic that exists.
func readCheckpoint(ctx context.Context, kcfg kafka.Config, topic string, id Identity, barrier ...kafka.Barrier) (*Checkpoint, error) {
	all, err := kafka.ReadCompactedRecords(ctx, kcfg, topic, barrier...)
	if err != nil {
		return nil, err
	}
	return PickCheckpoint(all, id.Key())
}
