package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/retention"
)

type replayArgs struct {
	since        string
	fromID, toID int64
	resume       bool
	batch        int
}

func replayFlags(o *options) (*flagSet, *replayArgs) {
	fs := newFlagSet("replay", o)
	addRunFlags(fs, o)
	var a replayArgs
	fs.StringVar(&a.since, "since", "", "publish the rows created at or after this time (RFC 3339, e.g. 2026-12-01T10:00:00Z)")
	fs.Int64Var(&a.fromID, "from-id", 0, "publish the rows with an id from this one")
	fs.Int64Var(&a.toID, "to-id", 0, "with --from-id: up to this id (0: no bound)")
	fs.BoolVar(&a.resume, "resume", false, "create the slot first if missing, then run after the replay, accepting the gap it filled")
	fs.IntVar(&a.batch, "replay-batch", 1000, "rows read and published per round")
	return fs, &a
}

// cmdReplay publishes outbox rows again from the table, after the slot that
// should have streamed them was lost (dropped, invalidated, or left behind on
// a failed-over primary). With --resume it then ensures the slot first —
// before reading, so nothing committed meanwhile falls between the replay
// and the stream — and runs, accepting the gap the replay just filled.
// Consumers deduplicate by outbox-id as always.
func cmdReplay(ctx context.Context, args []string) error {
	var o options
	fs, a := replayFlags(&o)
	since, fromID, toID, resume, batch := &a.since, &a.fromID, &a.toID, &a.resume, &a.batch
	if err := parse(fs, args); err != nil {
		return err
	}
	rng := poll.Range{FromID: *fromID, ToID: *toID}
	if *since != "" {
		t, err := time.Parse(time.RFC3339, *since)
		if err != nil {
			return fmt.Errorf("invalid configuration: --since %q: use RFC 3339, e.g. 2026-12-01T10:00:00Z", *since)
		}
		rng.Since = t
	}
	// The range and all of run's settings now, before anything connects or
	// is created: a --resume that the run would refuse must not publish
	// every row first, nor a range that selects nothing create the slot.
	if err := rng.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	if *batch < 1 {
		return errors.New("invalid configuration: --replay-batch must be ≥ 1")
	}
	kcfg, logger, err := o.setup()
	if err != nil {
		return err
	}
	defer logger.Sync()
	slotCreated := false
	if *resume {
		if slotCreated, err = prepare(ctx, &o, logger); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	prod, err := kafka.NewProducer(kcfg, logger.Named("kafka"), kafka.ProducerHooks{})
	if err != nil {
		return err
	}
	defer func() {
		prod.Close()
		for range prod.Results() {
		}
	}()
	origin, err := replayOrigin(ctx, &o, kcfg)
	if err != nil {
		return err
	}
	enc, err := o.formats.encoder(&o, logger.Named("format"), nil)
	if err != nil {
		return err
	}
	pcfg := poll.DefaultConfig()
	pcfg.Schema, pcfg.Table, pcfg.Mapping = o.slot.Schema, o.slot.Table, o.pub.Mapping
	rp := &replayer{prod: prod, enc: enc, origin: origin, mapping: &o.pub.Mapping, log: logger}
	n, err := poll.Replay(ctx, conn, pcfg, rng, *batch, func(events []replication.Event) error {
		return rp.publish(ctx, events)
	})
	if err != nil {
		return fmt.Errorf("replay stopped after %d rows: %w", n, err)
	}
	fmt.Fprintf(os.Stderr, "replay: %d rows published again\n", n)
	if !*resume {
		return nil
	}
	o.pub.AcceptGap = true
	return runCDC(ctx, &o, slotCreated)
}

// replayer publishes replayed rows as run would: encoded in run's formats,
// with run's origin header, waiting for Kafka to acknowledge each round.
type replayer struct {
	prod    *kafka.Producer
	enc     publisher.Encoder // nil: payloads as they are
	origin  []byte            // nil: no origin header
	mapping *outbox.Mapping
	log     *zap.Logger
}

// publish sends one round of rows and waits for all their acknowledgements.
func (p *replayer) publish(ctx context.Context, events []replication.Event) error {
	for i := range events {
		r := outbox.NewRecord(&events[i], p.mapping, time.Now())
		if p.enc != nil {
			// The formats run publishes in; a payload that does not fit
			// stops the replay, naming it.
			if err := p.enc.Encode(ctx, r); err != nil {
				return fmt.Errorf("replay: outbox id %d: %w", r.OutboxID, err)
			}
		}
		if p.origin != nil {
			r.Headers = append(r.Headers, kafka.Header{Key: outbox.HeaderOrigin, Value: p.origin})
		}
		if err := p.prod.Send(ctx, r); err != nil {
			return err
		}
	}
	for range events {
		select {
		case r := <-p.prod.Results():
			if r.Err != nil {
				return fmt.Errorf("replay: outbox id %d: %w", r.OutboxID, r.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.log.Info("replayed", zap.Int("rows", len(events)),
		zap.Int64("from_id", events[0].ID), zap.Int64("to_id", events[len(events)-1].ID))
	return nil
}

// replayOrigin is the origin header outboxd run sends on this server's
// current history (the checkpoint's generation), nil with checkpoints off
// or in another tool's record shape.
// Replayed rows carry it, like the rows run publishes: after a reset to a
// new history, rows written before the rewind are new to consumers again
// under it (docs/postgres.md: replay only what was written after).
func replayOrigin(ctx context.Context, o *options, kcfg kafka.Config) ([]byte, error) {
	topic := o.pub.CheckpointTopic
	if topic == "" || !o.pub.Mapping.SendsOrigin() || o.poll.source == sourcePoll {
		return nil, nil // rows run publishes carry no origin either
	}
	h, err := replication.ReadServerHistory(ctx, o.streamConfig())
	if err != nil {
		return nil, err
	}
	id := publisher.Identity{SystemID: h.SystemID, Timeline: h.Timeline, Database: h.Database, Slot: o.slot.Slot}
	cp, err := publisher.ReadCheckpoint(ctx, kcfg, topic, id)
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint from %q: %w", topic, err)
	}
	gen := 0
	if cp != nil {
		gen = cp.Generation
	}
	return []byte(id.Origin(gen)), nil
}

type pruneArgs struct {
	olderThan     time.Duration
	publishedOnly bool
}

func pruneFlags(o *options) (*flagSet, *pruneArgs) {
	fs := newFlagSet("prune", o)
	var a pruneArgs
	fs.DurationVar(&a.olderThan, "older-than", 0, "delete the outbox rows whose created_at is older than this (required)")
	fs.BoolVar(&a.publishedOnly, "published-only", false, "only rows with published_at set (the polling source's table)")
	return fs, &a
}

// cmdPrune deletes old outbox rows once (what --retention does on a
// schedule).
func cmdPrune(ctx context.Context, args []string) error {
	var o options
	fs, a := pruneFlags(&o)
	olderThan, publishedOnly := &a.olderThan, &a.publishedOnly
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := retention.DefaultConfig()
	cfg.Schema, cfg.Table, cfg.OlderThan, cfg.PublishedOnly = o.slot.Schema, o.slot.Table, *olderThan, *publishedOnly
	if err := errors.Join(o.validateCommon(), cfg.Validate()); err != nil {
		return fmt.Errorf("invalid configuration: %w (set --older-than)", err)
	}
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	n, err := retention.Prune(ctx, conn, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prune: deleted %d outbox rows older than %s\n", n, *olderThan)
	return nil
}
