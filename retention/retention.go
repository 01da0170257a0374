// Package retention deletes old outbox rows, in small batches and off the
// hot path.
//
// Under CDC a row is never read again after its INSERT: logical decoding
// publishes it from the WAL record of the INSERT, which holds the whole row,
// so deleting the row — even before outboxd read that part of the WAL —
// loses no event. What a deleted row cannot do any more is be replayed
// (outboxd replay reads the table): keep rows longer than a lost slot can go
// unnoticed. Under polling (--source=poll) only rows already published are
// deleted.
package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Config says what to delete. Start from DefaultConfig.
type Config struct {
	Schema, Table string
	// OlderThan: rows whose created_at is older are deleted.
	OlderThan time.Duration
	// Interval between two prunes of Run.
	Interval time.Duration
	// BatchSize rows are deleted per statement, so no statement holds many
	// locks or runs long.
	BatchSize int
	// PublishedOnly deletes only rows with published_at set (the polling
	// source's table).
	PublishedOnly bool
}

// DefaultConfig prunes public.outbox every minute, 1,000 rows a statement.
func DefaultConfig() Config {
	return Config{Schema: "public", Table: "outbox", Interval: time.Minute, BatchSize: 1000}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.OlderThan <= 0 {
		errs = append(errs, fmt.Errorf("retention must be > 0, got %s", c.OlderThan))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("retention interval must be > 0, got %s", c.Interval))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("retention batch size must be ≥ 1, got %d", c.BatchSize))
	}
	return errors.Join(errs...)
}

// Prune deletes the rows older than cfg.OlderThan, BatchSize at a time,
// and returns how many it deleted.
func Prune(ctx context.Context, conn *pgx.Conn, cfg Config) (int64, error) {
	t := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	cond := "created_at < now() - $1::interval"
	if cfg.PublishedOnly {
		cond += " AND published_at IS NOT NULL"
	}
	q := "DELETE FROM " + t + " WHERE id IN (SELECT id FROM " + t + " WHERE " + cond + " ORDER BY id LIMIT $2)"
	var total int64
	for {
		tag, err := conn.Exec(ctx, q, cfg.OlderThan.String(), cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("retention: delete from %s.%s: %w", cfg.Schema, cfg.Table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(cfg.BatchSize) {
			return total, nil
		}
	}
}

// Metrics of the pruner, registered on the Registerer given to NewPruner.
type Metrics struct {
	Deleted    prometheus.Counter
	TableBytes prometheus.Gauge
}

// Pruner runs Prune every Interval until its context ends.
type Pruner struct {
	cfg Config
	dsn string
	log *zap.Logger
	m   Metrics
}

// NewPruner builds a pruner for the database at dsn. reg may be nil.
func NewPruner(cfg Config, dsn string, log *zap.Logger, reg prometheus.Registerer) (*Pruner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := Metrics{
		Deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outboxd_retention_deleted_rows_total", Help: "Outbox rows deleted by --retention.",
		}),
		TableBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outboxd_outbox_table_bytes", Help: "The outbox table's size with its indexes and TOAST, at the last prune.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Deleted, m.TableBytes)
	}
	return &Pruner{cfg: cfg, dsn: dsn, log: log, m: m}, nil
}

// Run prunes every Interval until ctx ends (it returns nil then). A failed
// prune is logged and tried again at the next interval: retention is never
// worth stopping the publisher for.
func (p *Pruner) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		if err := p.once(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("retention: prune failed; trying again at the next interval", zap.Error(err))
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// pruneTimeout bounds one prune (connecting, the deletes, the size): a
// server that does not answer. It is not the interval: prunes never overlap
// (Run starts the next after this one returned), and a prune cut at a short
// interval could have its DELETE committed by the server while the client
// counted a failure — rows deleted, neither logged nor counted.
const pruneTimeout = time.Minute

func (p *Pruner) once(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Interval, pruneTimeout))
	defer cancel()
	conn, err := pgx.Connect(cctx, p.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	n, err := Prune(cctx, conn, p.cfg)
	p.m.Deleted.Add(float64(n))
	if err != nil {
		return err
	}
	if n > 0 {
		p.log.Info("retention: deleted old outbox rows", zap.Int64("rows", n), zap.Duration("older_than", p.cfg.OlderThan))
	}
	var size int64
	if err := conn.QueryRow(cctx, `SELECT pg_total_relation_size(to_regclass($1))`,
		pgx.Identifier{p.cfg.Schema, p.cfg.Table}.Sanitize()).Scan(&size); err == nil {
		p.m.TableBytes.Set(float64(size))
	}
	return nil
}
