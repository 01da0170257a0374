package kafka

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/halt"
)

var (
	// ErrPoison means Kafka refused an event for good (too large, unknown
	// topic, invalid record) or the event has no topic. Restarting would hit
	// it again, so the service halts unless a dead-letter topic is set.
	ErrPoison = halt.New("poison event")
	// ErrProduce means a produce failed after the producer's retries. The
	// pipeline restarts from the last confirmed position.
	ErrProduce = errors.New("produce failed")
	// ErrCheckpointTopic means the checkpoint topic cannot hold checkpoints
	// safely as it is (more than one partition): a setting to change.
	ErrCheckpointTopic = halt.New("kafka: unusable checkpoint topic")
)

// PoisonError names the event Kafka refused.
type PoisonError struct {
	OutboxID int64
	// EventID is the event id when it is not an integer (a uuid).
	EventID string
	Topic   string
	Size    int // key + value + headers, bytes
	Err     error
}

func (e *PoisonError) Error() string {
	return fmt.Sprintf("poison event: outbox id %s to topic %q (%d bytes) refused: %v; nothing was confirmed past it: fix the cause (topic, size limits) or set --dead-letter-topic, then restart",
		eventID(e.OutboxID, e.EventID), e.Topic, e.Size, e.Err)
}

// Unwrap matches both ErrPoison and the cause.
func (e *PoisonError) Unwrap() []error { return []error{ErrPoison, e.Err} }

// ProduceError is a produce failure that is not the event's fault (broker
// unreachable, not enough replicas, timeouts).
type ProduceError struct {
	OutboxID int64
	EventID  string // as in PoisonError
	Topic    string
	Err      error
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("produce outbox id %s to topic %q: %v", eventID(e.OutboxID, e.EventID), e.Topic, e.Err)
}

// eventID is an event's id as messages show it.
func eventID(id int64, text string) string {
	if text != "" {
		return text
	}
	return strconv.FormatInt(id, 10)
}

// Unwrap matches both ErrProduce and the cause.
func (e *ProduceError) Unwrap() []error { return []error{ErrProduce, e.Err} }

// PartitionsShrunkError fails the records of a topic whose partition count
// went down: Kafka cannot remove partitions, so the topic was deleted and
// recreated with fewer. It is a produce failure, not poison: the pipeline
// restarts, and the restart's producer routes keys by the new count.
type PartitionsShrunkError struct {
	Topic    string
	From, To int32
}

func (e *PartitionsShrunkError) Error() string {
	return fmt.Sprintf("topic %q now has %d partitions, not %d (deleted and recreated with fewer): its records in this session fail; the restart routes keys by the new count (murmur2 %% %d), so a key may move to another partition, and its order across the change holds only if the old partitions had been drained (records of a deleted topic are gone with it)",
		e.Topic, e.To, e.From, e.To)
}

// ErrTimestampRefused means a broker refused records for their timestamps
// (INVALID_TIMESTAMP): see TimestampError. The service halts.
var ErrTimestampRefused = halt.New("kafka refused the records' timestamps")

// TimestampError is a batch a broker refused with INVALID_TIMESTAMP: a
// record's timestamp (its outbox row's created_at, else its transaction's
// commit time) lies further from the broker's clock than the topic's
// message.timestamp.before.max.ms or message.timestamp.after.max.ms allow.
// That is seldom the event's fault — a clock is off (the application's,
// PostgreSQL's or the broker's), or a backlog is older than the setting —
// so it is not poison: diverting it would divert every event of the window
// to the dead-letter topic. Nor does a restart help: the same records meet
// the same refusal, and each restart would send the other partitions'
// unconfirmed records again. The service halts, naming the settings; once
// the clock or the setting is fixed, a start sends the records again.
type TimestampError struct {
	Topic       string
	Partition   int32
	First, Last time.Time // the batch's first and latest record timestamps
	Now         time.Time // outboxd's clock when the refusal came
	Err         error
}

func (e *TimestampError) Error() string {
	return fmt.Sprintf("kafka refused the record timestamps of topic %q partition %d (%s to %s; outboxd's clock %s): the broker allows timestamps only within message.timestamp.before.max.ms and message.timestamp.after.max.ms of its own clock (topic settings; broker defaults log.message.timestamp.before.max.ms and log.message.timestamp.after.max.ms; older brokers: message.timestamp.difference.max.ms). A record's timestamp is its outbox row's created_at, else its commit time: fix the clock that is off (application, PostgreSQL or broker), or raise the setting (or set message.timestamp.type=LogAppendTime on the topic), then start outboxd again; nothing was confirmed past these records (%v)",
		e.Topic, e.Partition, e.First.UTC().Format(time.RFC3339Nano), e.Last.UTC().Format(time.RFC3339Nano), e.Now.UTC().Format(time.RFC3339Nano), e.Err)
}

// Unwrap matches ErrTimestampRefused (a halt) and the cause.
func (e *TimestampError) Unwrap() []error { return []error{ErrTimestampRefused, e.Err} }

// ErrNotAuthorized means the brokers refused an operation for lack of an
// ACL. A restart does not fix it: the service halts and says which ACL to
// grant.
var ErrNotAuthorized = halt.New("kafka: not authorized")

// ACLError names the ACL the brokers found missing.
type ACLError struct {
	Operation    string // as kafka-acls.sh spells it: Write, Create, Describe, Read
	ResourceType string // transactional-id, topic, group, cluster
	Resource     string
	Principal    string // the SASL user, when known
	Err          error
}

func (e *ACLError) Error() string {
	principal := e.Principal
	if principal == "" {
		principal = "<outboxd's user>"
	}
	return fmt.Sprintf("kafka: not authorized: outboxd's principal lacks the %s ACL on %s %q; grant it with: kafka-acls.sh --bootstrap-server <broker> --command-config <admin.properties> --add --allow-principal User:%s --operation %s --%s %s (%v)",
		e.Operation, e.ResourceType, e.Resource, principal, e.Operation, e.ResourceType, e.Resource, e.Err)
}

// Unwrap matches ErrNotAuthorized and the cause.
func (e *ACLError) Unwrap() []error { return []error{ErrNotAuthorized, e.Err} }
