package publisher

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
)

// Identity names what one outboxd deployment publishes: one PostgreSQL
// system (its system identifier), database and slot.
type Identity struct {
	SystemID string
	Timeline int32
	Database string
	// DatabaseOID tells a database from an earlier one of the same name.
	DatabaseOID uint32
	Slot        string
	// Epoch is the session's checkpoint epoch: one past the offset of the
	// read barrier it wrote once it held the slot, trusted because the slot
	// was still its own after the barrier was acknowledged
	// (Service.checkpointing). Every later owner of the slot writes its
	// barrier later, so it has a higher epoch. 0: the key of checkpoints
	// written before epochs.
	Epoch int64
}

// Key is the identity's base key in the checkpoint topic: the key of its
// checkpoints written before epochs, and the prefix of the others
// (CheckpointKey). The read barrier's key is Key() + "/read-barrier".
func (id Identity) Key() string { return "outboxd/" + id.SystemID + "/" + id.Database + "/" + id.Slot }

// epochSep separates the base key from the epoch. A slot name holds only
// lower-case letters, digits and underscores, and a base key ends in one,
// so no identity's base key looks like another's epoch key: every
// deployment reads only its own keys.
const epochSep = "#"

// CheckpointKey is the key of the identity's checkpoints in its epoch:
// Key() + "#" + epoch (Key() alone for epoch 0). A key per epoch is what
// keeps a paused earlier owner's late write from replacing the new owner's
// checkpoint: compaction keeps the last record per key, and the reader
// takes the highest epoch (PickCheckpoint), whatever arrived last.
func (id Identity) CheckpointKey() string { return epochKey(id.Key(), id.Epoch) }

func epochKey(base string, epoch int64) string {
	if epoch == 0 {
		return base
	}
	return base + epochSep + strconv.FormatInt(epoch, 10)
}

// SplitCheckpointKey splits a checkpoint topic key into the identity's base
// key (Identity.Key) and the epoch (0: a key from before epochs). ok is
// false for a key that is no checkpoint's (a read barrier).
func SplitCheckpointKey(key string) (base string, epoch int64, ok bool) {
	if strings.HasSuffix(key, "/read-barrier") {
		return "", 0, false
	}
	// A database name may hold a "#" too: only a slot's can decide, and
	// a slot name holds none, so a key whose last "#" is not followed by an
	// epoch alone is a base key.
	i := strings.LastIndex(key, epochSep)
	if i < 0 {
		return key, 0, true
	}
	e, err := strconv.ParseInt(key[i+len(epochSep):], 10, 64)
	if err != nil || e <= 0 || key[i+len(epochSep):] != strconv.FormatInt(e, 10) {
		return key, 0, true
	}
	return key[:i], e, true
}

// PickCheckpoint is the checkpoint of the identity whose base key is base
// (Identity.Key) among a checkpoint topic's latest values
// (kafka.ReadCompactedRecords), nil when it has none: the latest record of
// its highest epoch. Arrival order does not decide between epochs: a
// session paused past wal_sender_timeout while another took the slot over
// can write its last checkpoint after the new owner's newer ones, under
// its own, lower epoch, which is ignored. One exception: the key from
// before epochs (epoch 0) wins when it was written after every epoch's
// record — an outboxd from before epochs ran for the slot since (a
// downgrade), and its checkpoint is the newest. Its Epoch is the one it
// was read under; the keys of every record of the identity read are kept
// for the session to tombstone once its own epoch holds a record.
func PickCheckpoint(latest map[string]kafka.CompactedRecord, base string) (*Checkpoint, error) {
	var best, legacy *kafka.CompactedRecord
	var bestEpoch int64
	var keys []string
	for k, r := range latest {
		b, e, ok := SplitCheckpointKey(k)
		if !ok || b != base {
			continue
		}
		keys = append(keys, k)
		switch {
		case e == 0:
			legacy = &r
		case best == nil || e > bestEpoch:
			best, bestEpoch = &r, e
		}
	}
	if legacy != nil && (best == nil || legacy.Offset > newestEpochRecord(latest, base)) {
		best, bestEpoch = legacy, 0
	}
	if best == nil {
		return nil, nil
	}
	c, err := ParseCheckpoint(best.Value)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %q: %w", epochKey(base, bestEpoch), err)
	}
	c.Epoch = bestEpoch
	slices.Sort(keys)
	c.keys = keys
	return c, nil
}

// newestEpochRecord is the offset of the last record under any epoch key
// of base (-1: none).
func newestEpochRecord(latest map[string]kafka.CompactedRecord, base string) int64 {
	newest := int64(-1)
	for k, r := range latest {
		if b, e, ok := SplitCheckpointKey(k); ok && b == base && e > 0 {
			newest = max(newest, r.Offset)
		}
	}
	return newest
}

// TransactionalID is the Kafka transactional id of the identity's
// exactly-once producer: two outboxd instances for the same slot fence each
// other; instances for other slots, databases or clusters never do.
func (id Identity) TransactionalID() string {
	return "outboxd-" + id.SystemID + "-" + id.Database + "-" + id.Slot
}

// Checkpoint says where outboxd was: everything before EndLSN is in Kafka.
// It is written to a compacted topic, in the same Kafka transaction as the
// records in exactly-once mode, after their acknowledgements in
// at-least-once mode, and always before that position is confirmed to
// PostgreSQL: the slot's confirmed position is never ahead of it.
type Checkpoint struct {
	SystemID    string
	Database    string
	DatabaseOID uint32
	Slot        string
	Timeline    int32
	// EndLSN is the position after which nothing was published yet.
	EndLSN pglogrepl.LSN
	// CommitLSN, Xid and CommitTime describe the last transaction included
	// (zero for a checkpoint of an idle position).
	CommitLSN  pglogrepl.LSN
	Xid        uint32
	CommitTime time.Time
	WrittenAt  time.Time
	// MaxOutboxID is the highest integer outbox id outboxd ever published
	// for this identity (carried from checkpoint to checkpoint): after the
	// database went back in time the id sequence is moved past it.
	MaxOutboxID int64
	// Generation counts the resets to a new history (outboxd checkpoint
	// reset --to-current-history); it is part of the origin header, so ids
	// reused after a restore are not mistaken for duplicates.
	Generation int
	// Refused, when set, is the refusal of a database that went back in
	// time: every later start refuses with it until outboxd checkpoint
	// reset, even once the server's WAL has moved past the checkpoint again.
	Refused string
	// Epoch is the epoch of the session that wrote it (Identity.Epoch),
	// from its key when read (PickCheckpoint).
	Epoch int64
	// keys are every key of the identity the read found (PickCheckpoint):
	// the session tombstones those of earlier epochs once its own holds a
	// record, so that the topic keeps one per identity.
	keys []string
}

// Origin is the value of the origin header of the events published under
// this checkpoint's identity: system identifier, database and generation.
func (id Identity) Origin(generation int) string {
	return fmt.Sprintf("%s/%s/%d", id.SystemID, id.Database, generation)
}

// checkpointWire is a checkpoint record's value: JSON, LSNs in
// PostgreSQL's text form.
type checkpointWire struct {
	SystemID    string    `json:"system_id"`
	Database    string    `json:"database"`
	DatabaseOID uint32    `json:"database_oid,omitempty"`
	Slot        string    `json:"slot"`
	Timeline    int32     `json:"timeline"`
	EndLSN      string    `json:"end_lsn"`
	CommitLSN   string    `json:"commit_lsn,omitempty"`
	Xid         uint32    `json:"xid,omitempty"`
	CommitTime  time.Time `json:"commit_time,omitzero"`
	WrittenAt   time.Time `json:"written_at"`
	MaxOutboxID int64     `json:"max_outbox_id,omitempty"`
	Generation  int       `json:"generation,omitempty"`
	Refused     string    `json:"refused,omitempty"`
	Epoch       int64     `json:"epoch,omitempty"`
}

// MarshalJSON writes the record value.
func (c Checkpoint) MarshalJSON() ([]byte, error) {
	w := checkpointWire{SystemID: c.SystemID, Database: c.Database, DatabaseOID: c.DatabaseOID, Slot: c.Slot, Timeline: c.Timeline,
		EndLSN: c.EndLSN.String(), Xid: c.Xid, CommitTime: c.CommitTime, WrittenAt: c.WrittenAt,
		MaxOutboxID: c.MaxOutboxID, Generation: c.Generation, Refused: c.Refused, Epoch: c.Epoch}
	if c.CommitLSN != 0 {
		w.CommitLSN = c.CommitLSN.String()
	}
	return json.Marshal(w)
}

// ParseCheckpoint reads a checkpoint record's value.
func ParseCheckpoint(b []byte) (*Checkpoint, error) {
	var w checkpointWire
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	c := &Checkpoint{SystemID: w.SystemID, Database: w.Database, DatabaseOID: w.DatabaseOID, Slot: w.Slot, Timeline: w.Timeline,
		Xid: w.Xid, CommitTime: w.CommitTime, WrittenAt: w.WrittenAt, MaxOutboxID: w.MaxOutboxID, Generation: w.Generation, Refused: w.Refused,
		Epoch: w.Epoch}
	var err error
	if c.EndLSN, err = pglogrepl.ParseLSN(w.EndLSN); err != nil {
		return nil, fmt.Errorf("checkpoint: end_lsn %q: %w", w.EndLSN, err)
	}
	if w.CommitLSN != "" {
		if c.CommitLSN, err = pglogrepl.ParseLSN(w.CommitLSN); err != nil {
			return nil, fmt.Errorf("checkpoint: commit_lsn %q: %w", w.CommitLSN, err)
		}
	}
	return c, nil
}

// ErrGap means outboxd cannot prove that nothing was lost between where it
// was (its checkpoint) and where the slot is: it refuses to stream.
var ErrGap = halt.New("gap between the checkpoint and the slot")

// checkGap compares the checkpoint with the slot. A missing checkpoint is a
// first start (or checkpoints were off): nothing to compare.
func checkGap(cp *Checkpoint, id Identity, slotConfirmed pglogrepl.LSN, topic string) error {
	if cp == nil {
		return nil
	}
	if cp.SystemID != id.SystemID {
		return fmt.Errorf("%w: the checkpoint for slot %q in %q was written by PostgreSQL system %s, this is system %s (a new cluster or a restore?): events since then may be missing from Kafka; republish them with \"outboxd replay\" if needed, then start with --accept-gap",
			ErrGap, id.Slot, topic, cp.SystemID, id.SystemID)
	}
	if slotConfirmed > cp.EndLSN {
		return fmt.Errorf("%w: slot %q is confirmed at %s but outboxd's checkpoint in %q is at %s (written %s): the slot was advanced or recreated by someone else, or the checkpoint topic was lost; events committed between them may never have reached Kafka: republish them if needed, then start with --accept-gap",
			ErrGap, id.Slot, slotConfirmed, topic, cp.EndLSN, cp.WrittenAt.Format(time.RFC3339))
	}
	return nil
}

// checkpointRecord is the Kafka record of cp in id's epoch.
func checkpointRecord(topic string, id Identity, cp Checkpoint) (*kafka.Record, error) {
	cp.SystemID, cp.Database, cp.DatabaseOID, cp.Slot, cp.Timeline = id.SystemID, id.Database, id.DatabaseOID, id.Slot, id.Timeline
	cp.Epoch = id.Epoch
	cp.WrittenAt = time.Now().UTC()
	v, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	return &kafka.Record{Topic: topic, Key: []byte(id.CheckpointKey()), Value: v, Timestamp: cp.WrittenAt}, nil
}
