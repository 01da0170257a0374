package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/slot"
)

// statusReport is what "outboxd status --json" prints.
type statusReport struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
	// Warnings do not fail the status (exit 0).
	Warnings    []string          `json:"warnings"`
	Slot        statusSlot        `json:"slot"`
	Publication statusPublication `json:"publication"`
	Checkpoint  *statusCheckpoint `json:"checkpoint,omitempty"`
}

// statusCheckpoint is outboxd's checkpoint of the slot, read from Kafka.
type statusCheckpoint struct {
	Topic    string `json:"topic"`
	Found    bool   `json:"found"`
	EndLSN   string `json:"end_lsn,omitempty"`
	SystemID string `json:"system_id,omitempty"`
	// Epoch is the epoch of the session that wrote it (0: written before
	// epochs): the highest is read, whatever arrived last.
	Epoch     int64  `json:"epoch,omitempty"`
	WrittenAt string `json:"written_at,omitempty"`
	// ReadTime is how long reading the topic to its high watermark took:
	// long when other producers' open transactions held it.
	ReadTime string `json:"read_time"`
}

type statusSlot struct {
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Plugin            string `json:"plugin,omitempty"`
	Database          string `json:"database,omitempty"`
	Active            bool   `json:"active"`
	ActivePID         int32  `json:"active_pid,omitempty"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN        string `json:"restart_lsn,omitempty"`
	CurrentWALLSN     string `json:"current_wal_lsn,omitempty"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	WALStatus         string `json:"wal_status,omitempty"`
	SafeWALSize       *int64 `json:"safe_wal_size"`
	// Failover and Synced: pg_replication_slots (PostgreSQL 17+; absent before).
	Failover           *bool  `json:"failover,omitempty"`
	Synced             *bool  `json:"synced,omitempty"`
	InvalidationReason string `json:"invalidation_reason,omitempty"`
}

type statusPublication struct {
	Name   string   `json:"name"`
	Exists bool     `json:"exists"`
	Tables []string `json:"tables"`
}

// statusCheckpointReadTimeout is status's default for reading the checkpoint
// topic: a check should answer soon, and the read has no open transaction to
// wait for.
const statusCheckpointReadTimeout = 30 * time.Second

// errStatus makes "outboxd status" exit 1 after it printed its report.
var errStatus = errors.New("status: problems found")

type statusArgs struct {
	asJSON, allowInactive bool
	maxLag, maxRetained   int64
	brokers, cpTopic      string
	cpRead                time.Duration
}

func statusFlags(o *options) (*flagSet, *statusArgs) {
	fs := newFlagSet("status", o)
	var a statusArgs
	fs.BoolVar(&a.asJSON, "json", false, "print the report as JSON", cliOnly)
	bytesVar(fs, &a.maxLag, "max-lag-bytes", 0, "also a problem: lag above this size (e.g. 1GiB; 0: no limit)")
	bytesVar(fs, &a.maxRetained, "max-retained-wal-bytes", 0, "also a problem: retained WAL above this size (e.g. 20GiB; 0: no limit)")
	fs.BoolVar(&a.allowInactive, "allow-inactive", false, "an inactive slot (no outboxd streaming) is not a problem")
	fs.StringVar(&a.brokers, "kafka-brokers", "", "also read outboxd's checkpoint from Kafka and show it next to the slot's position", inKafka)
	fs.StringVar(&a.cpTopic, "checkpoint-topic", publisher.DefaultConfig().CheckpointTopic, "with --kafka-brokers: the checkpoint topic", inDelivery)
	fs.DurationVar(&a.cpRead, "checkpoint-read-timeout", statusCheckpointReadTimeout, "with --kafka-brokers: how long reading the checkpoint topic may take (it never waits for open transactions, only for brokers that do not answer)", inDelivery)
	addSecurityFlags(fs, &o.kafkaSec)
	return fs, &a
}

func cmdStatus(ctx context.Context, args []string) error {
	var o options
	fs, a := statusFlags(&o)
	asJSON, maxLag, maxRetained, allowInactive := &a.asJSON, &a.maxLag, &a.maxRetained, &a.allowInactive
	brokers, cpTopic, cpRead := &a.brokers, &a.cpTopic, &a.cpRead
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := adminConn(ctx, &o)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rep, err := buildStatus(ctx, conn, o.slot, statusLimits{*maxLag, *maxRetained, *allowInactive})
	if err != nil {
		return err
	}
	if *brokers != "" {
		k := kafka.DefaultConfig()
		k.Brokers = strings.Split(*brokers, ",")
		k.Security = o.kafkaSec
		k.CheckpointReadTimeout = *cpRead
		if err := addCheckpoint(ctx, &rep, k, *cpTopic, o.slot.Slot); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := printStatus(os.Stdout, rep); err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("%w: %s", errStatus, strings.Join(rep.Problems, "; "))
	}
	return nil
}

type statusLimits struct {
	maxLag, maxRetained int64
	allowInactive       bool
}

func buildStatus(ctx context.Context, conn *pgx.Conn, cfg slot.Config, lim statusLimits) (statusReport, error) {
	rep := statusReport{
		Problems:    []string{},
		Slot:        statusSlot{Name: cfg.Slot},
		Publication: statusPublication{Name: cfg.Publication, Tables: []string{}},
	}
	problem := func(format string, a ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...)) }
	st, err := slot.GetStatus(ctx, conn, cfg)
	switch {
	case errors.Is(err, slot.ErrSlotMissing):
		problem("replication slot %q does not exist: run \"outboxd slot create\" (or \"outboxd run\", which creates it)", cfg.Slot)
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)`,
			cfg.Publication).Scan(&rep.Publication.Exists); err != nil {
			return rep, fmt.Errorf("status: read publication %q: %w", cfg.Publication, err)
		}
	case err != nil:
		return rep, err
	default:
		rep.Slot = statusSlot{
			Name: st.Slot, Exists: true, Plugin: st.Plugin, Database: st.Database,
			Active: st.Active, ActivePID: st.ActivePID,
			ConfirmedFlushLSN: st.ConfirmedFlushLSN.String(), RestartLSN: st.RestartLSN.String(),
			CurrentWALLSN: st.CurrentWALLSN.String(),
			LagBytes:      st.LagBytes, RetainedWALBytes: st.RetainedWALBytes,
			WALStatus: st.WALStatus, SafeWALSize: st.SafeWALSize,
			Failover: st.Failover, Synced: st.Synced, InvalidationReason: st.InvalidationReason,
		}
		rep.Publication.Exists = st.Publication != ""
		if st.PublicationTables != nil {
			rep.Publication.Tables = st.PublicationTables
		}
		if st.Plugin != "pgoutput" {
			problem("replication slot %q uses plugin %q, outboxd needs \"pgoutput\"", st.Slot, st.Plugin)
		}
		switch st.WALStatus {
		case "lost":
			problem("replication slot %q lost WAL it needed (wal_status lost): events were not published; drop and re-create the slot, then re-publish from the outbox table", st.Slot)
		case "unreserved":
			problem("replication slot %q holds more WAL than max_wal_size (wal_status unreserved): the next checkpoint may remove it unless outboxd catches up", st.Slot)
		}
		if !st.Active && !lim.allowInactive {
			problem("no process streams from replication slot %q: outboxd is not running (or is restarting)", st.Slot)
		}
		if lim.maxLag > 0 && st.LagBytes > lim.maxLag {
			problem("lag %d bytes is above --max-lag-bytes %d", st.LagBytes, lim.maxLag)
		}
		if lim.maxRetained > 0 && st.RetainedWALBytes > lim.maxRetained {
			problem("retained WAL %d bytes is above --max-retained-wal-bytes %d", st.RetainedWALBytes, lim.maxRetained)
		}
	}
	table := cfg.Schema + "." + cfg.Table
	switch {
	case !rep.Publication.Exists:
		problem("publication %q does not exist: run \"outboxd slot create\"", cfg.Publication)
	case rep.Slot.Exists && !slices.Contains(rep.Publication.Tables, table):
		problem("publication %q does not publish %s", cfg.Publication, table)
	}
	rep.Warnings = []string{}
	// A warning, as in run: not being able to check it is no problem of
	// the slot's.
	if sigs, err := slot.PublicEmitters(ctx, conn); err != nil {
		rep.Warnings = append(rep.Warnings, "could not check who may execute pg_logical_emit_message: "+err.Error())
	} else if w := slot.EmitWarning(sigs); w != "" {
		rep.Warnings = append(rep.Warnings, w)
	}
	rep.OK = len(rep.Problems) == 0
	return rep, nil
}

// addCheckpoint reads the slot's checkpoint (by database and slot: any
// system) and flags a slot ahead of it, as outboxd run would refuse it.
func addCheckpoint(ctx context.Context, rep *statusReport, k kafka.Config, topic, slotName string) error {
	start := time.Now()
	all, err := kafka.ReadCompactedRecords(ctx, k, topic)
	if err != nil {
		return fmt.Errorf("status: read the checkpoint topic %q: %w", topic, err)
	}
	rep.Checkpoint = &statusCheckpoint{Topic: topic, ReadTime: time.Since(start).Round(time.Millisecond).String()}
	// Every system's key of this database and slot, each read as outboxd
	// run reads its own: the latest record of the highest epoch.
	suffix := "/" + rep.Slot.Database + "/" + slotName
	var bases []string
	for key := range all {
		if base, _, ok := publisher.SplitCheckpointKey(key); ok && strings.HasSuffix(base, suffix) && !slices.Contains(bases, base) {
			bases = append(bases, base)
		}
	}
	slices.Sort(bases)
	for _, base := range bases {
		cp, err := publisher.PickCheckpoint(all, base)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		rep.Checkpoint.Found, rep.Checkpoint.EndLSN, rep.Checkpoint.SystemID = true, cp.EndLSN.String(), cp.SystemID
		rep.Checkpoint.Epoch = cp.Epoch
		rep.Checkpoint.WrittenAt = cp.WrittenAt.Format("2006-01-02T15:04:05Z07:00")
		if confirmed, err := pglogrepl.ParseLSN(rep.Slot.ConfirmedFlushLSN); err == nil && rep.Slot.Exists && confirmed > cp.EndLSN {
			rep.Problems = append(rep.Problems, fmt.Sprintf("slot %q is confirmed at %s, ahead of outboxd's checkpoint %s: outboxd run will refuse this gap (see --accept-gap)",
				slotName, confirmed, cp.EndLSN))
			rep.OK = false
		}
	}
	return nil
}

func printStatus(w io.Writer, rep statusReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	s := rep.Slot
	row("slot", s.Name)
	if s.Exists {
		row("plugin", s.Plugin)
		active := "no"
		if s.Active {
			active = fmt.Sprintf("yes (pid %d)", s.ActivePID)
		}
		row("active", active)
		row("confirmed lsn", s.ConfirmedFlushLSN)
		row("current wal lsn", s.CurrentWALLSN)
		row("lag", bytesText(s.LagBytes))
		row("retained wal", bytesText(s.RetainedWALBytes))
		safe := "unlimited (max_slot_wal_keep_size = -1)"
		if s.SafeWALSize != nil {
			safe = bytesText(*s.SafeWALSize)
		}
		row("wal_status", s.WALStatus)
		row("safe wal size", safe)
		if s.Failover != nil {
			row("failover", *s.Failover)
		}
		if s.InvalidationReason != "" {
			row("invalidation reason", s.InvalidationReason)
		}
	} else {
		row("exists", "no")
	}
	pub := rep.Publication.Name
	if !rep.Publication.Exists {
		pub += " (missing)"
	} else if len(rep.Publication.Tables) > 0 {
		pub += " (" + strings.Join(rep.Publication.Tables, ", ") + ")"
	}
	row("publication", pub)
	if c := rep.Checkpoint; c != nil {
		if c.Found {
			row("checkpoint", fmt.Sprintf("%s (written %s, epoch %d, topic %s, read in %s)", c.EndLSN, c.WrittenAt, c.Epoch, c.Topic, c.ReadTime))
		} else {
			row("checkpoint", fmt.Sprintf("none in %s (read in %s)", c.Topic, c.ReadTime))
		}
	}
	if rep.OK {
		row("status", "OK")
	} else {
		row("status", fmt.Sprintf("%d problem(s)", len(rep.Problems)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
	for _, x := range rep.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", x)
	}
	return nil
}

// bytesText is n bytes with a binary-unit approximation.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%d B (%.1f %ciB)", n, float64(n)/float64(div), "KMGTP"[exp])
}
