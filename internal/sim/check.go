package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
)

// maxListed bounds the examples one violation lists.
const maxListed = 8

// check holds the records a read_committed reader saw against the WAL and
// the slot's confirmed position:
//
//  1. nothing confirmed that is not in Kafka: every event of a transaction
//     ending at or below the confirmed position is there;
//  2. every event delivered; exactly-once: every event exactly once, and no
//     torn transaction (each row of a PostgreSQL transaction seen as often
//     as the others);
//  3. per key, the first deliveries follow commit order.
//
// Records carry the event's payload, checked too: a record is the event
// it claims to be. A forged, replayed or foreign message is no event: a
// record of one is a violation.
func check(txns []*Txn, confirmed pglogrepl.LSN, recs, dead []record, exactlyOnce bool, firstPartition func(key string) int32) []string {
	var v []string
	type rowAt struct {
		txn *Txn
		row Row
		seq int // commit order of events
	}
	rows := map[int64]rowAt{}
	for _, t := range txns {
		for _, r := range t.Rows {
			rows[r.ID] = rowAt{t, r, len(rows)}
		}
	}
	seen := map[int64]int{}
	var bad []string
	for _, rec := range recs {
		ra, ok := rows[rec.id]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("p%d@%d: outbox-id %d is no event of the WAL", rec.partition, rec.offset, rec.id))
			continue
		case !ra.row.Event():
			bad = append(bad, fmt.Sprintf("p%d@%d: the %s %d (txn %d) was published", rec.partition, rec.offset,
				kindNames[ra.row.Kind], ra.row.ID, ra.txn.Index))
			continue
		case rec.key != ra.row.Key || rec.value != ra.row.Payload:
			bad = append(bad, fmt.Sprintf("p%d@%d: event %d with key %q and a %d-byte value, want key %q and its %d-byte payload",
				rec.partition, rec.offset, rec.id, rec.key, len(rec.value), ra.row.Key, len(ra.row.Payload)))
		}
		seen[rec.id]++
	}
	if len(bad) > 0 {
		v = append(v, "records not of the WAL: "+list(bad))
	}

	// Bad events: in the dead-letter topic (at least once: its writes are
	// not part of a Kafka transaction), never among the events.
	deadSeen := map[int64]int{}
	for _, rec := range dead {
		deadSeen[rec.id]++
	}
	var undead []string
	for _, t := range txns {
		for _, r := range t.Rows {
			if r.Bad() && deadSeen[r.ID] == 0 {
				undead = append(undead, fmt.Sprintf("%s %d (txn %d, end %s)", kindNames[r.Kind], r.ID, t.Index, t.End))
			}
		}
	}
	if len(undead) > 0 {
		v = append(v, fmt.Sprintf("%d bad events never dead-lettered: %s", len(undead), list(undead)))
	}

	// 1. Confirmed ⊆ Kafka.
	var lost []string
	for _, t := range txns {
		if t.End > confirmed {
			continue
		}
		for _, r := range t.Rows {
			if r.Event() && seen[r.ID] == 0 {
				lost = append(lost, fmt.Sprintf("event %d (txn %d, end %s)", r.ID, t.Index, t.End))
			}
		}
	}
	if len(lost) > 0 {
		v = append(v, fmt.Sprintf("confirmed but not in Kafka (slot at %s): %s", confirmed, list(lost)))
	}

	// 2. Delivery.
	var missing, dups, torn []string
	for _, t := range txns {
		counts := map[int]bool{}
		for _, r := range t.Rows {
			if !r.Event() {
				continue
			}
			n := seen[r.ID]
			counts[n] = true
			switch {
			case n == 0:
				missing = append(missing, fmt.Sprint(r.ID))
			case n > 1 && exactlyOnce:
				dups = append(dups, fmt.Sprintf("%d ×%d", r.ID, n))
			}
		}
		if exactlyOnce && len(counts) > 1 {
			var c []string
			for _, r := range t.Rows {
				if r.Event() {
					c = append(c, fmt.Sprintf("%d×%d", r.ID, seen[r.ID]))
				}
			}
			torn = append(torn, fmt.Sprintf("txn %d (%s)", t.Index, strings.Join(c, " ")))
		}
	}
	if len(missing) > 0 {
		v = append(v, fmt.Sprintf("%d events never delivered: %s", len(missing), list(missing)))
	}
	if len(dups) > 0 {
		v = append(v, fmt.Sprintf("exactly-once: %d events delivered more than once: %s", len(dups), list(dups)))
	}
	if len(torn) > 0 {
		v = append(v, fmt.Sprintf("exactly-once: %d torn PostgreSQL transactions (rows seen unequally often): %s", len(torn), list(torn)))
	}

	// 3. Per-key order of first deliveries. A key lives in one partition
	// while the partition count stays, so its records in offset order are
	// the order a consumer sees. When the topic grows, a key may move to
	// another partition, and outboxd moves it only once every record of it
	// in its first partition was acknowledged (drain, then move): the
	// key's records in its first partition come before those in the new
	// one.
	sorted := slices.Clone(recs)
	slices.SortFunc(sorted, func(a, b record) int {
		moved := func(r record) bool { return r.partition != firstPartition(r.key) }
		return cmp.Or(cmp.Compare(a.key, b.key), compareBool(moved(a), moved(b)),
			cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
	})
	// Commit order is the events' order in the WAL: table ids and
	// messages' LSNs are not comparable.
	first := map[int64]bool{}
	last := map[string]rowAt{}
	var order []string
	for _, rec := range sorted {
		ra, ok := rows[rec.id]
		if !ok || !ra.row.Event() || first[rec.id] {
			continue
		}
		first[rec.id] = true
		if prev, ok := last[rec.key]; ok && ra.seq < prev.seq {
			order = append(order, fmt.Sprintf("key %s: event %d first delivered after %d (p%d@%d)", rec.key, rec.id, prev.row.ID, rec.partition, rec.offset))
		}
		if prev, ok := last[rec.key]; !ok || ra.seq > prev.seq {
			last[rec.key] = ra
		}
	}
	if len(order) > 0 {
		v = append(v, "per-key order: "+list(order))
	}
	return v
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

var kindNames = [...]string{RowInsert: "insert", RowEmit: "outbox_emit", RowForged: "forged", RowReplayed: "replayed", RowForeign: "foreign",
	RowBadTopic: "bad insert (NULL topic)", RowBadEmit: "bad outbox_emit (reserved header)", RowBigEmit: "outbox_emit too large to publish"}

func list(items []string) string {
	if len(items) > maxListed {
		return strings.Join(items[:maxListed], "; ") + fmt.Sprintf("; … (%d more)", len(items)-maxListed)
	}
	return strings.Join(items, "; ")
}
