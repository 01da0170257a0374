// Package democheck measures the demo: what Postgres holds, what outboxd has
// yet to publish, what Kafka holds and what the consumer did, and the check
// that `make demo` ends with. democtl and the end-to-end test share it.
package democheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// PendingOutbox counts the outbox rows outboxd has yet to publish: the
// outbox INSERTs of transactions that committed after the slot's
// confirmed_flush_lsn (the position outboxd confirms only once Kafka acked
// everything before it). It decodes a temporary copy of the slot with
// pg_copy_logical_replication_slot and pg_logical_slot_peek_binary_changes
// (pgoutput, the publication), so it consumes nothing, works while outboxd
// streams from the slot, and sees exactly what outboxd would be sent: the
// publication publishes only INSERTs into the outbox table, so the Insert
// messages ('I') are the pending rows. It needs a free replication slot and
// reads the WAL from the slot's restart_lsn, so it is a tool for the demo and
// for checks, not for a monitoring loop on a big backlog.
func PendingOutbox(ctx context.Context, conn *pgx.Conn, slot, publication string) (int64, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	tmp := "outboxd_pending_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2, true)`, slot, tmp); err != nil {
		return 0, fmt.Errorf("copy slot %s: %w", slot, err)
	}
	// A temporary slot goes with the session anyway; dropping it at once
	// frees it for the next check.
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_drop_replication_slot($1)`, tmp) }()
	var n int64
	err := conn.QueryRow(ctx, `
		SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		    'proto_version', '1', 'publication_names', $2)
		 WHERE substr(data, 1, 1) = 'I'::bytea`, tmp, publication).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("decode pending changes of slot %s: %w", slot, err)
	}
	return n, nil
}

// EndOffsets returns each partition's end offset (the offset the next record
// gets) for every topic.
func EndOffsets(client sarama.Client, topics ...string) (map[string]map[int32]int64, error) {
	out := map[string]map[int32]int64{}
	for _, t := range topics {
		parts, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", t, err)
		}
		out[t] = map[int32]int64{}
		for _, p := range parts {
			off, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", t, p, err)
			}
			out[t][p] = off
		}
	}
	return out, nil
}

// Sum adds a topic's partition offsets.
func Sum(offsets map[int32]int64) int64 {
	var n int64
	for _, o := range offsets {
		n += o
	}
	return n
}

// Lag returns how many records of the topics lie past the group's committed
// offsets (a partition without a commit counts from 0).
func Lag(client sarama.Client, admin sarama.ClusterAdmin, group string, topics ...string) (int64, error) {
	ends, err := EndOffsets(client, topics...)
	if err != nil {
		return 0, err
	}
	parts := map[string][]int32{}
	for t, ps := range ends {
		for p := range ps {
			parts[t] = append(parts[t], p)
		}
	}
	resp, err := admin.ListConsumerGroupOffsets(group, parts)
	if err != nil {
		return 0, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	if !errors.Is(resp.Err, sarama.ErrNoError) {
		return 0, fmt.Errorf("committed offsets of group %s: %w", group, resp.Err)
	}
	var lag int64
	for t, ps := range ends {
		for p, end := range ps {
			committed := int64(0)
			if b := resp.GetBlock(t, p); b != nil && b.Offset > 0 {
				committed = b.Offset
			}
			lag += max(0, end-committed)
		}
	}
	return lag, nil
}

// Counts is what the demo's check looks at.
type Counts struct {
	Orders     int64 // rows in orders
	Unsent     int64 // orders still 'created': the post-publish hook did not run for them
	Mismatched int64 // orders whose projected status differs from the service's
	OutboxRows int64 // rows in outbox (both topics)
	Pending    int64 // PendingOutbox

	// Of the orders topic (order.created events):
	EndOffsets int64 // records in Kafka, duplicates included
	Unique     int64 // outbox ids processed (processed_outbox_ids rows of the topic)
	Skipped    int64 // redeliveries the consumer skipped (sum of duplicates)
	Projected  int64 // rows in the projection order_status

	// Of the status topic (order.status_changed events), for the record:
	StatusEndOffsets, StatusUnique, StatusSkipped int64

	DLQ int64 // records in both dead-letter topics
}

// Names are where Collect looks.
type Names struct {
	Slot, Publication        string
	OrdersTopic, StatusTopic string
	DLQTopics                []string
}

// Collect measures everything; conn is a connection to the demo database.
func Collect(ctx context.Context, conn *pgx.Conn, client sarama.Client, n Names) (Counts, error) {
	var c Counts
	err := conn.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM orders),
		       (SELECT count(*) FROM orders WHERE status = 'created'),
		       (SELECT count(*) FROM orders o LEFT JOIN order_status p ON p.order_id = o.id
		         WHERE p.status IS DISTINCT FROM o.status),
		       (SELECT count(*) FROM outbox),
		       (SELECT count(*) FROM processed_outbox_ids WHERE topic = $1),
		       (SELECT coalesce(sum(duplicates), 0) FROM processed_outbox_ids WHERE topic = $1),
		       (SELECT count(*) FROM order_status),
		       (SELECT count(*) FROM processed_outbox_ids WHERE topic = $2),
		       (SELECT coalesce(sum(duplicates), 0) FROM processed_outbox_ids WHERE topic = $2)`,
		n.OrdersTopic, n.StatusTopic).Scan(&c.Orders, &c.Unsent, &c.Mismatched, &c.OutboxRows, &c.Unique, &c.Skipped, &c.Projected, &c.StatusUnique, &c.StatusSkipped)
	if err != nil {
		return c, fmt.Errorf("count rows: %w", err)
	}
	if c.Pending, err = PendingOutbox(ctx, conn, n.Slot, n.Publication); err != nil {
		return c, err
	}
	ends, err := EndOffsets(client, append([]string{n.OrdersTopic, n.StatusTopic}, n.DLQTopics...)...)
	if err != nil {
		return c, err
	}
	c.EndOffsets, c.StatusEndOffsets = Sum(ends[n.OrdersTopic]), Sum(ends[n.StatusTopic])
	for _, t := range n.DLQTopics {
		c.DLQ += Sum(ends[t])
	}
	return c, nil
}

// Assertion is one line of the check.
type Assertion struct {
	Name string
	Got  int64
	Want string
	OK   bool
}

// Check returns the demo's assertions for wantOrders orders and wantInvalid
// invalid transitions: the six of the issue (orders, pending, unique
// processed, end offsets, skipped duplicates = end offsets - orders, DLQ), the
// effect once per order in the projection, the post-publish hook run for
// every order, and the projection agreeing with the service on every order's
// status.
func (c Counts) Check(wantOrders, wantInvalid int64) []Assertion {
	eq := func(name string, got, want int64) Assertion {
		return Assertion{Name: name, Got: got, Want: fmt.Sprintf("= %d", want), OK: got == want}
	}
	return []Assertion{
		eq("orders", c.Orders, wantOrders),
		eq("outbox pending", c.Pending, 0),
		eq("unique processed", c.Unique, wantOrders),
		{Name: "end offsets", Got: c.EndOffsets, Want: fmt.Sprintf(">= %d", wantOrders), OK: c.EndOffsets >= wantOrders},
		eq("skipped duplicates", c.Skipped, c.EndOffsets-wantOrders),
		eq("projected orders", c.Projected, wantOrders),
		eq("DLQ", c.DLQ, wantInvalid),
		eq("orders not sent", c.Unsent, 0),
		eq("projection mismatches", c.Mismatched, 0),
	}
}

// Report prints the counts and the assertions and reports whether all hold.
func (c Counts) Report(w io.Writer, n Names, wantOrders, wantInvalid int64) bool {
	fmt.Fprintf(w, "orders=%d (still 'created': %d, projection disagrees: %d) outbox rows=%d pending=%d\n",
		c.Orders, c.Unsent, c.Mismatched, c.OutboxRows, c.Pending)
	fmt.Fprintf(w, "%s: end offsets=%d unique processed=%d skipped duplicates=%d projected=%d\n",
		n.OrdersTopic, c.EndOffsets, c.Unique, c.Skipped, c.Projected)
	fmt.Fprintf(w, "%s: end offsets=%d unique processed=%d skipped duplicates=%d\n",
		n.StatusTopic, c.StatusEndOffsets, c.StatusUnique, c.StatusSkipped)
	fmt.Fprintf(w, "dead-letter topics: %d records\n", c.DLQ)
	ok := true
	for _, a := range c.Check(wantOrders, wantInvalid) {
		verdict := "ok"
		if !a.OK {
			verdict, ok = "FAILED", false
		}
		fmt.Fprintf(w, "check: %-21s = %-5d (want %s) %s\n", a.Name, a.Got, a.Want, verdict)
	}
	if ok {
		fmt.Fprintln(w, "check: all assertions hold")
	} else {
		fmt.Fprintln(w, "check: FAILED")
	}
	return ok
}
