package main

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/slot"
)

// slotPoller reads pg_replication_slots every interval on a connection of its
// own and feeds the slot metrics (server WAL position, lag bytes, retained
// WAL, active, wal_status, safe_wal_size). It is an actor of the run group;
// a failed poll is counted and logged once, and the next one reconnects. A
// slot that is not there is an answer, not a failure: it is reported as
// wal_status "missing" (the alert for a lost slot covers both).
type slotPoller struct {
	dsn      string
	cfg      slot.Config
	interval time.Duration
	m        *outbox.Metrics
	log      *zap.Logger

	conn    *pgx.Conn
	failing bool
	missing bool // the last answer was: no such slot
}

func (p *slotPoller) run(ctx context.Context) error {
	defer p.close()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *slotPoller) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(p.interval, 5*time.Second))
	defer cancel()
	err := p.read(ctx)
	if ctx.Err() != nil && err != nil {
		return // stopping
	}
	if err != nil {
		p.m.SlotPollFailed()
		p.close()
		if !p.failing {
			p.log.Warn("cannot read the slot for the lag metrics; retrying", zap.Duration("every", p.interval), zap.Error(err))
		}
		p.failing = true
		return
	}
	if p.failing {
		p.log.Info("reading the slot for the lag metrics again")
	}
	p.failing = false
}

func (p *slotPoller) read(ctx context.Context) error {
	if p.conn == nil {
		cfg, err := pgx.ParseConfig(p.dsn)
		if err != nil {
			return err
		}
		cfg.RuntimeParams["application_name"] = "outboxd-slot-poller"
		if p.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return err
		}
	}
	st, err := slot.GetStatus(ctx, p.conn, p.cfg)
	if errors.Is(err, slot.ErrSlotMissing) {
		p.m.SlotMissing()
		if !p.missing {
			p.log.Warn("the replication slot does not exist", zap.String("slot", p.cfg.Slot))
		}
		p.missing = true
		return nil
	}
	if err != nil {
		return err
	}
	p.missing = false
	p.m.ObserveSlot(slotPoll(st))
	return nil
}

// slotPoll is what the slot metrics take from one status.
func slotPoll(st slot.Status) outbox.SlotPoll {
	return outbox.SlotPoll{
		ServerWAL:     st.CurrentWALLSN,
		SlotConfirmed: st.ConfirmedFlushLSN,
		RestartLSN:    st.RestartLSN,
		Active:        st.Active,
		WALStatus:     st.WALStatus,
		SafeWALSize:   st.SafeWALSize,
	}
}

func (p *slotPoller) close() {
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = p.conn.Close(ctx)
		p.conn = nil
	}
}
