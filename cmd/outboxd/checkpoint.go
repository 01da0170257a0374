package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
)

// cmdCheckpointReset is "outboxd checkpoint reset --to-current-history",
// the one step after outboxd refused a database that went back in time: it
// moves the outbox id sequence past the highest id outboxd ever published
// (so new events never reuse an id consumers have seen), then starts the
// checkpoint over at the slot's position on the server's current history,
// with the next origin generation. The slot is created first when missing,
// so nothing written from now on falls before it.
func checkpointResetFlags(o *options) (*flagSet, *bool) {
	fs := newFlagSet("checkpoint reset", o)
	addRunFlags(fs, o)
	toCurrent := fs.Bool("to-current-history", false, "required: start the checkpoint over on the server's current WAL history")
	return fs, toCurrent
}

func cmdCheckpointReset(ctx context.Context, args []string) error {
	var o options
	fs, toCurrent := checkpointResetFlags(&o)
	if err := parse(fs, args); err != nil {
		return err
	}
	if !*toCurrent {
		return errors.New("invalid configuration: checkpoint reset needs --to-current-history (the only reset there is)")
	}
	topic := o.pub.CheckpointTopic
	if topic == "" {
		return errors.New("invalid configuration: checkpoints are off (--checkpoint-topic is empty): nothing to reset")
	}
	kcfg, logger, err := o.setup()
	if err != nil {
		return err
	}
	defer logger.Sync()
	if _, err := prepare(ctx, &o, logger); err != nil {
		return err
	}
	h, err := replication.ReadServerHistory(ctx, o.streamConfig())
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	id, at, err := slotIdentity(ctx, conn, h, o.slot.Slot)
	if err != nil {
		return err
	}
	old, err := publisher.ReadCheckpoint(ctx, kcfg, topic, id)
	if err != nil {
		return fmt.Errorf("read the checkpoint from %q: %w", topic, err)
	}
	next := publisher.Checkpoint{EndLSN: at}
	if old != nil {
		next.MaxOutboxID, next.Generation = old.MaxOutboxID, old.Generation+1
	}
	moved, err := moveSequence(ctx, conn, &o, next.MaxOutboxID)
	if err != nil {
		return err
	}
	if err := writeResetCheckpoint(ctx, &o, kcfg, logger, id, next); err != nil {
		return err
	}
	was := "none"
	if old != nil {
		was = fmt.Sprintf("%s on timeline %d, generation %d", old.EndLSN, old.Timeline, old.Generation)
	}
	fmt.Fprintf(os.Stderr, "checkpoint reset: %s; checkpoint in %q now at %s on timeline %d (was %s); events now carry origin %q; start outboxd again\n",
		moved, topic, at, h.Timeline, was, id.Origin(next.Generation))
	return nil
}

// slotIdentity is the identity outboxd run would have on this server, and
// the slot's confirmed position.
func slotIdentity(ctx context.Context, conn *pgx.Conn, h *replication.History, slotName string) (publisher.Identity, pglogrepl.LSN, error) {
	var oid uint32
	var confirmed string
	err := conn.QueryRow(ctx, `SELECT coalesce(datoid, 0), coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`,
		slotName).Scan(&oid, &confirmed)
	if err != nil {
		return publisher.Identity{}, 0, fmt.Errorf("read replication slot %q: %w", slotName, err)
	}
	at, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		return publisher.Identity{}, 0, fmt.Errorf("replication slot %q: confirmed_flush_lsn %q: %w", slotName, confirmed, err)
	}
	return publisher.Identity{SystemID: h.SystemID, Timeline: h.Timeline, Database: h.Database, DatabaseOID: oid, Slot: slotName}, at, nil
}

// moveSequence sets the outbox id column's sequence past maxID (never back)
// and says what it did. It never sets the sequence past what the sequence
// or the column can hold: a checkpoint's highest id beyond that is no id of
// this table (an outboxd before the row/message split counted outbox_emit
// messages' LSNs as ids), so the sequence is left as it is, and said so.
func moveSequence(ctx context.Context, conn *pgx.Conn, o *options, maxID int64) (string, error) {
	col := o.decoder.Columns.ID
	if col == "" {
		col = replication.DefaultColumns().ID
	}
	table := pgx.Identifier{o.slot.Schema, o.slot.Table}.Sanitize()
	var seq *string
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_get_serial_sequence($1, $2)`, table, col).Scan(&seq); err != nil {
		return "", fmt.Errorf("find the sequence of %s.%s: %w", table, col, err)
	}
	switch {
	case seq == nil:
		return fmt.Sprintf("id column %s.%s has no sequence (uuid ids?): nothing to move", table, col), nil
	case maxID <= 0:
		return fmt.Sprintf("the checkpoint does not know the highest id published (written by an older outboxd): sequence %s NOT moved; set it past the highest outbox id your consumers have seen: SELECT setval('%s', <id>)", *seq, *seq), nil
	}
	// The most the id can be: the sequence's own maximum, and the column
	// type's (an int4 column fed by a bigint sequence fails past 2^31-1).
	var limit int64
	var colType string
	err := conn.QueryRow(ctx, `SELECT least(s.seqmax, CASE a.atttypid WHEN 'int2'::regtype THEN 32767 WHEN 'int4'::regtype THEN 2147483647 ELSE s.seqmax END),
       pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_sequence s, pg_catalog.pg_attribute a
WHERE s.seqrelid = $1::regclass AND a.attrelid = $2::regclass AND a.attname = $3`, *seq, table, col).Scan(&limit, &colType)
	if err != nil {
		return "", fmt.Errorf("read the maximum of sequence %s and column %s.%s: %w", *seq, table, col, err)
	}
	if maxID > limit {
		return fmt.Sprintf("the checkpoint's highest id %d is past what %s.%s (%s, sequence %s) can hold, %d, so it is no id of this table (an older outboxd counted outbox_emit messages' LSNs as ids): sequence %s NOT moved; set it past the highest outbox id your consumers have seen: SELECT setval('%s', <id>)",
			maxID, table, col, colType, *seq, limit, *seq, *seq), nil
	}
	var now int64
	err = conn.QueryRow(ctx, `SELECT pg_catalog.setval($1::regclass, greatest($2::bigint, coalesce(pg_catalog.pg_sequence_last_value($1::regclass), 0)))`,
		*seq, maxID).Scan(&now)
	if err != nil {
		return "", fmt.Errorf("move sequence %s past %d: %w", *seq, maxID, err)
	}
	if now >= limit {
		return fmt.Sprintf("sequence %s moved past outbox id %d to its maximum %d: new rows fail until the id is widened (ALTER TABLE %s ALTER COLUMN %s TYPE bigint; ALTER SEQUENCE %s AS bigint)",
			*seq, maxID, limit, table, pgx.Identifier{col}.Sanitize(), *seq), nil
	}
	return "sequence " + *seq + " moved past outbox id " + strconv.FormatInt(maxID, 10) + " (next id " + strconv.FormatInt(now+1, 10) + ")", nil
}

// writeResetCheckpoint writes cp as id's checkpoint with a producer like
// outboxd run's (in exactly-once mode with its transactional id, which fences
// any outboxd still running for the slot).
func writeResetCheckpoint(ctx context.Context, o *options, kcfg kafka.Config, logger *zap.Logger, id publisher.Identity, cp publisher.Checkpoint) error {
	if o.pub.Delivery == publisher.ExactlyOnce {
		kcfg.TransactionalID = id.TransactionalID()
	}
	if err := kafka.EnsureCompactedTopic(kcfg, o.pub.CheckpointTopic); err != nil {
		return err
	}
	prod, err := kafka.NewProducer(kcfg, logger.Named("kafka"), kafka.ProducerHooks{})
	if err != nil {
		return err
	}
	defer func() {
		prod.Close()
		for range prod.Results() {
		}
	}()
	return publisher.WriteCheckpoint(ctx, prod, o.pub, id, cp)
}
