package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/slot"
)

func adminConn(ctx context.Context, o *options) (*pgx.Conn, error) {
	if err := o.validateCommon(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

func migrateFlags(o *options) *flagSet {
	fs := newFlagSet("migrate", o)
	fs.StringVar(&o.poll.source, "source", sourceCDC, "the source outboxd run will use: cdc (the outbox table and outbox_emit), messages (outbox_emit only; the table is created but unused) or poll (also the published_at column and the partial index the poller needs, on --schema/--table)", inShape,
		choices(sourceCDC, sourceMessages, sourcePoll))
	return fs
}

// cmdMigrate applies what outboxd itself needs: its embedded migrations
// (the outbox table public.outbox) and, with --source=poll, the poller's
// published_at column and partial index on the --schema/--table outbox
// (poll.Migrate). The consumer's dedup table (consumer.Migrate) and the
// examples' tables (examples/internal/brew) ship with their owners.
func cmdMigrate(ctx context.Context, args []string) error {
	var o options
	fs := migrateFlags(&o)
	if err := parse(fs, args); err != nil {
		return err
	}
	if o.poll.source != sourceCDC && o.poll.source != sourcePoll && o.poll.source != sourceMessages {
		return fmt.Errorf("invalid configuration: --source %q: use %s, %s or %s", o.poll.source, sourceCDC, sourceMessages, sourcePoll)
	}
	logger, err := o.logger(os.Stderr)
	if err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	applied, err := migrations.Apply(ctx, conn, logger)
	for _, a := range applied {
		fmt.Println("migrate: applied", a)
	}
	if err != nil {
		return err
	}
	if o.poll.source == sourcePoll {
		created, err := poll.Migrate(ctx, conn, o.slot.Schema, o.slot.Table)
		if err != nil {
			return err
		}
		for _, c := range created {
			logger.Info("created for --source=poll", zap.String("object", c))
			fmt.Println("migrate: created", c)
			applied = append(applied, c)
		}
	}
	if len(applied) == 0 {
		fmt.Println("migrate: up to date")
	}
	// The migrations go into the connection's current schema; run reads
	// outbox_emit's key from --schema by name. Said now, or run would not
	// find it (and, under --source=cdc, read on without messages).
	var current string
	if err := conn.QueryRow(ctx, `SELECT coalesce(current_schema(), '')`).Scan(&current); err != nil {
		return fmt.Errorf("read the current schema: %w", err)
	}
	if current != o.slot.Schema {
		logger.Warn("outboxd's migrations are in another schema than --schema", zap.String("current_schema", current), zap.String("schema", o.slot.Schema))
		fmt.Printf("migrate: warning: outbox_emit, its key and the outbox table are in schema %q (this connection's search_path), not --schema %q: pass --schema %q to outboxd run, or migrate with that search_path\n",
			current, o.slot.Schema, current)
	}
	// outbox_emit's messages are authenticated either way; revoking also
	// stops any role from writing WAL with outboxd's prefix at all.
	left, err := slot.RevokePublicEmit(ctx, conn)
	if err != nil {
		return err
	}
	if w := slot.EmitWarning(left); w != "" {
		logger.Warn("could not revoke pg_logical_emit_message from PUBLIC (needs a superuser)")
		fmt.Println("migrate: warning:", w)
	} else {
		fmt.Println("migrate: PUBLIC cannot execute pg_logical_emit_message")
	}
	return nil
}

func emitKeyRotateFlags(o *options) (*flagSet, *bool) {
	fs := newFlagSet("emit-key rotate", o)
	forget := fs.Bool("forget-old-keys", false, "replace all three keys (signing, staged and previous) at once, after they leaked; pause the writers, let outboxd drain and restart it around it: running sessions know none of the new keys")
	return fs, forget
}

// cmdEmitKeyRotate is "outboxd emit-key rotate": SELECT
// outbox_emit_rotate_key() in --schema, as the role that ran migrate (it
// owns the key table; nobody else may rotate).
func cmdEmitKeyRotate(ctx context.Context, args []string) error {
	var o options
	fs, forget := emitKeyRotateFlags(&o)
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	fn := pgx.Identifier{o.slot.Schema, "outbox_emit_rotate_key"}.Sanitize()
	if _, err := conn.Exec(ctx, `SELECT `+fn+`($1)`, *forget); err != nil {
		return fmt.Errorf("emit-key rotate: %s: %w", fn, err)
	}
	if *forget {
		fmt.Println("emit-key rotate: replaced every key; restart outboxd (its sessions know none of them)")
	} else {
		fmt.Println("emit-key rotate: the staged key signs now, the old one is kept as previous; restart outboxd before rotating again")
	}
	return nil
}

func cmdSlotCreate(ctx context.Context, args []string) error {
	var o options
	if err := parse(newFlagSet("slot create", &o), args); err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	created, err := slot.Ensure(ctx, conn, o.slot, true)
	if err != nil {
		return err
	}
	if len(created) == 0 {
		fmt.Println("slot create: publication and slot already exist")
	}
	for _, c := range created {
		fmt.Println("slot create: created", c)
	}
	return nil
}

// slotDropFlags: --publication-too is no key of a file, which every command
// reads: a shared file must never drop a publication.
func slotDropFlags(o *options) *flagSet {
	fs := newFlagSet("slot drop", o)
	fs.BoolVar(&o.dropPublication, "publication-too", false, "also drop the publication", cliOnly)
	return fs
}

func cmdSlotDrop(ctx context.Context, args []string) error {
	var o options
	fs := slotDropFlags(&o)
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := slot.Drop(ctx, conn, o.slot, o.dropPublication); err != nil {
		return err
	}
	fmt.Printf("slot drop: dropped slot %q\n", o.slot.Slot)
	return nil
}

func cmdSlotStatus(ctx context.Context, args []string) error {
	var o options
	if err := parse(newFlagSet("slot status", &o), args); err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	st, err := slot.GetStatus(ctx, conn, o.slot)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s\t%v\n", k, v) }
	row("slot", st.Slot)
	row("plugin", st.Plugin)
	row("database", st.Database)
	row("active", st.Active)
	row("active pid", st.ActivePID)
	row("confirmed_flush_lsn", st.ConfirmedFlushLSN)
	row("restart_lsn", st.RestartLSN)
	row("current wal lsn", st.CurrentWALLSN)
	row("lag bytes", st.LagBytes)
	row("retained wal bytes", st.RetainedWALBytes)
	row("wal_status", st.WALStatus)
	if st.Failover != nil { // PostgreSQL 17+
		row("failover", *st.Failover)
		row("synced", *st.Synced)
		row("invalidation_reason", st.InvalidationReason)
	}
	row("publication", st.Publication)
	row("publication tables", strings.Join(st.PublicationTables, ", "))
	return w.Flush()
}
