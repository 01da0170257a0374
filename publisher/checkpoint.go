package publisher

import (
	"encoding/json"
	"fmt"
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
}

// Key is the identity's key in the checkpoint topic.
func (id Identity) Key() string { return "outboxd/" + id.SystemID + "/" + id.Database + "/" + id.Slot }

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
}

// MarshalJSON writes the record value.
func (c Checkpoint) MarshalJSON() ([]byte, error) {
	w := checkpointWire{SystemID: c.SystemID, Database: c.Database, DatabaseOID: c.DatabaseOID, Slot: c.Slot, Timeline: c.Timeline,
		EndLSN: c.EndLSN.String(), Xid: c.Xid, CommitTime: c.CommitTime, WrittenAt: c.WrittenAt,
		MaxOutboxID: c.MaxOutboxID, Generation: c.Generation, Refused: c.Refused}
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
		Xid: w.Xid, CommitTime: w.CommitTime, WrittenAt: w.WrittenAt, MaxOutboxID: w.MaxOutboxID, Generation: w.Generation, Refused: w.Refused}
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

// checkpointRecord is the Kafka record of cp.
func checkpointRecord(topic string, id Identity, cp Checkpoint) (*kafka.Record, error) {
	cp.SystemID, cp.Database, cp.DatabaseOID, cp.Slot, cp.Timeline = id.SystemID, id.Database, id.DatabaseOID, id.Slot, id.Timeline
	cp.WrittenAt = time.Now().UTC()
	v, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	return &kafka.Record{Topic: topic, Key: []byte(id.Key()), Value: v, Timestamp: cp.WrittenAt}, nil
}
