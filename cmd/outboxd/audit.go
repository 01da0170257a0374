package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/replication"
)

// errAudit makes "outboxd audit" exit 1 after it printed a report with a
// verdict.
var errAudit = errors.New("audit: not clean")

type auditArgs struct {
	cfg                          audit.Config
	since, until, fromOffsetTime string
	topics                       *stringList
	asJSON, allowDup, repair     bool
	batch                        int
}

func auditFlags(o *options) (*flagSet, *auditArgs) {
	fs := newFlagSet("audit", o)
	addRunFlags(fs, o)
	a := auditArgs{cfg: audit.DefaultConfig(), topics: new(stringList)}
	fs.Int64Var(&a.cfg.FromID, "from-id", 0, "audit the rows with an id from this one")
	fs.Int64Var(&a.cfg.ToID, "to-id", 0, "with --from-id: up to this id (0: the highest in the table)")
	fs.StringVar(&a.since, "since", "", "audit the rows created at or after this time (RFC 3339), instead of --from-id")
	fs.StringVar(&a.until, "until", "", "with --since: the rows created before this time (default: now)")
	fs.StringVar(&a.fromOffsetTime, "from-offset-time", "", "read each partition from the first record at or after this time (RFC 3339; outboxd's record timestamp is the row's created_at) instead of from its start: at or before the oldest created_at audited")
	fs.Var(a.topics, "topic", "also read this topic (repeatable): one whose rows retention deleted, for the records with no row")
	fs.BoolVar(&a.asJSON, "json", false, "print the report as JSON", cliOnly)
	fs.DurationVar(&a.cfg.StableTimeout, "stable-timeout", a.cfg.StableTimeout, "how long to wait for each partition's last stable offset to reach its high watermark (an open transaction holds it)")
	fs.IntVar(&a.cfg.Examples, "examples", a.cfg.Examples, "ids listed per verdict and topic")
	fs.BoolVar(&a.allowDup, "allow-duplicates", false, "duplicates do not fail the audit (at-least-once delivery allows them)")
	fs.BoolVar(&a.repair, "repair", false, "republish exactly the missing rows (replay's path: same ids, consumers deduplicate), then audit again")
	fs.IntVar(&a.batch, "replay-batch", 1000, "with --repair: rows read and published per round")
	return fs, &a
}

// cmdAudit proves delivery for a range of outbox rows (package audit): it
// takes run's settings, so that it reads the topics, table and record shape
// outboxd publishes with; --repair republishes the missing rows through
// replay's path and audits again.
func cmdAudit(ctx context.Context, args []string) error {
	var o options
	fs, a := auditFlags(&o)
	cfg, topics := &a.cfg, a.topics
	since, until, fromOffsetTime := &a.since, &a.until, &a.fromOffsetTime
	asJSON, allowDup, repair, batch := &a.asJSON, &a.allowDup, &a.repair, &a.batch
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, t := range []struct {
		name string
		s    string
		to   *time.Time
	}{{"since", *since, &cfg.Since}, {"until", *until, &cfg.Until}, {"from-offset-time", *fromOffsetTime, &cfg.FromOffsetTime}} {
		if t.s == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.s)
		if err != nil {
			return usageErrorf("--%s %q: use RFC 3339, e.g. 2026-12-01T10:00:00Z", t.name, t.s)
		}
		*t.to = v
	}
	kcfg, logger, err := o.setup()
	if err != nil {
		return &UsageError{Msg: err.Error()}
	}
	defer logger.Sync()
	cfg.Schema, cfg.Table, cfg.Mapping, cfg.Topics = o.slot.Schema, o.slot.Table, o.pub.Mapping, *topics
	cfg.CheckContent = o.defaultRecordShape()
	if err := cfg.Validate(); err != nil {
		return &UsageError{Msg: "invalid configuration: " + err.Error()}
	}
	if o.pub.Mapping.IDHeader == "-" {
		return usageErrorf("invalid configuration: --id-header - sends no id: records cannot be matched to rows")
	}
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	rep, err := audit.Run(ctx, conn, kcfg, *cfg)
	if err != nil {
		return err
	}
	if *repair && rep.MissingCount() > 0 {
		rep.DuplicatesAllowed = *allowDup
		if err := printAudit(rep, *asJSON); err != nil {
			return err
		}
		n, err := repairMissing(ctx, &o, kcfg, conn, rep, *batch)
		if err != nil {
			return fmt.Errorf("repair stopped after %d rows: %w", n, err)
		}
		fmt.Fprintf(os.Stderr, "audit: republished %d missing rows; auditing again\n", n)
		if rep, err = audit.Run(ctx, conn, kcfg, *cfg); err != nil {
			return err
		}
	}
	rep.DuplicatesAllowed = *allowDup
	if err := printAudit(rep, *asJSON); err != nil {
		return err
	}
	if !rep.CleanIgnoring(*allowDup) {
		return errAudit
	}
	return nil
}

func printAudit(rep *audit.Report, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(os.Stdout)
}

// defaultRecordShape reports whether records are outboxd's own default
// shape, which the audit can rebuild from a row: --format outboxd, raw key
// and value, no Schema Registry format, no CloudEvents, no header columns.
func (o *options) defaultRecordShape() bool {
	m, s, f := o.pub.Mapping, o.shapeOpts, o.formats
	return s.format == formatOutboxd && (m.KeyEncoding == "" || m.KeyEncoding == "raw") &&
		(m.ValueEncoding == "" || m.ValueEncoding == "raw") && len(s.headerColumns) == 0 &&
		s.topicTemplate == "" && f.valueFormat == "" && f.keyFormat == "" && f.cloudEvents == ""
}

// repairMissing republishes the missing ids of rep through replay's path
// (poll.Replay read the rows, replayer sends them as run would, with run's
// origin header), one contiguous run of ids at a time, so that only the
// missing rows are sent again.
func repairMissing(ctx context.Context, o *options, kcfg kafka.Config, conn *pgx.Conn, rep *audit.Report, batch int) (int, error) {
	ranges := rep.MissingRanges()
	logger, err := o.logger(os.Stderr)
	if err != nil {
		return 0, err
	}
	prod, err := kafka.NewProducer(kcfg, logger.Named("kafka"), kafka.ProducerHooks{})
	if err != nil {
		return 0, err
	}
	defer func() {
		prod.Close()
		for range prod.Results() {
		}
	}()
	origin, err := replayOrigin(ctx, o, kcfg)
	if err != nil {
		return 0, err
	}
	enc, err := o.formats.encoder(o, logger.Named("format"), nil)
	if err != nil {
		return 0, err
	}
	pcfg := poll.DefaultConfig()
	pcfg.Schema, pcfg.Table, pcfg.Mapping = o.slot.Schema, o.slot.Table, o.pub.Mapping
	rp := &replayer{prod: prod, enc: enc, origin: origin, mapping: &o.pub.Mapping, log: logger}
	total := 0
	for _, r := range ranges {
		n, err := poll.Replay(ctx, conn, pcfg, poll.Range{FromID: r[0], ToID: r[1]}, batch, func(events []replication.Event) error {
			return rp.publish(ctx, events)
		})
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
