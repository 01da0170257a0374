package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/publisher"
)

// Topic is the event topic of the simulated outbox, CheckpointTopic the
// service's checkpoint topic.
const (
	Topic           = "orders"
	CheckpointTopic = "outboxd.checkpoints"
	DeadLetterTopic = "orders.dead-letter"
)

// Sizes bound a run's workload and fault schedule.
type Sizes struct {
	Txns        int // PostgreSQL transactions
	MaxRows     int // rows per transaction: 1..MaxRows
	Keys        int // aggregates: few, so that per-key order is tested
	Bursts      int // the transactions are committed in this many bursts
	ConnFaults  int // replication connections scripted with a fault
	KafkaFaults int // broker faults, each installed at a burst
	// MoreKafkaFaults are broker faults of further kinds (drawn after all
	// the others, so that adding them left what a seed drew before as it
	// was): set-up requests, the checkpoint read, connections cut.
	MoreKafkaFaults int
	// Brokers is kfake's cluster size (0: one); Moves are leader or
	// coordinator moves among them, drawn after the messages.
	Brokers    int32
	Moves      int
	Partitions int32 // partitions of Topic
	// Messages adds logical decoding messages to the workload (see
	// Plan.addMessages).
	Messages bool
	// BadRows adds bad events (see Plan.addBadRows), and BigTxn now and
	// then one transaction of 1,000 to BigTxn rows: both drawn last.
	BadRows bool
	BigTxn  int
	// Grow adds partitions to Topic in one seed in four, and EpochBumps
	// answers an exactly-once request with INVALID_PRODUCER_EPOCH in one in
	// four: drawn last.
	Grow       bool
	EpochBumps bool
	// Standby runs a second instance beside the first in one seed in
	// three (drawn last): it waits for the slot, takes over when a
	// connection drop frees it, and the two fence each other as two
	// outboxd processes of one deployment do.
	Standby bool
	// BigMessages puts, in one seed in four, an outboxd message larger
	// than a record may be (1.2 MB, over the producer's 1 MiB max message
	// bytes and the filter's slack) into a transaction: authentic (a bad
	// event) or forged (rejected). Drawn last.
	BigMessages bool
}

// DefaultSizes are TestSim's: a run takes a few seconds with -race.
func DefaultSizes() Sizes {
	return Sizes{Txns: 60, MaxRows: 5, Keys: 5, Bursts: 8, ConnFaults: 6, KafkaFaults: 4, MoreKafkaFaults: 2, Partitions: 3, Messages: true, Brokers: 3, Moves: 2, BadRows: true, BigTxn: 10000, Grow: true, EpochBumps: true, Standby: true, BigMessages: true}
}

// Plan is what one seed decides: the workload and the fault schedule.
type Plan struct {
	Seed   uint64
	Sizes  Sizes
	Txns   [][]Row         // rows of each transaction, in commit order
	Rel    []bool          // the transaction describes the table again
	Idle   []int           // idle WAL (other tables) after each transaction
	Bursts []int           // index of the first transaction of each burst
	Pause  []time.Duration // pause after each burst
	// Conn is the fault of each connection, in accept order; connections
	// past the end have none.
	Conn  []ConnFault
	Kafka []KafkaFault
	// Instances is how many outboxd processes run (1, or 2 with a standby).
	Instances int
}

// KafkaFault is a broker fault installed when burst At starts.
type KafkaFault struct {
	At    int
	Key   kmsg.Key
	Err   *kerr.Error   // nil: a slow answer instead
	Count int           // requests it answers
	Delay time.Duration // a slow answer's delay
	// Cut closes the client's connection instead of answering (the request
	// is not applied): Count requests.
	Cut bool
	// Move elects a new leader, node MoveTo, for partition MovePartition
	// of MoveTopic (its epoch goes up: requests to the old leader are
	// answered NOT_LEADER_FOR_PARTITION); Rehash moves every transaction
	// coordinator instead. Neither has a Key or a Count.
	Move          bool
	MoveTopic     string
	MovePartition int32
	MoveTo        int32
	Rehash        bool
	// GrowTo adds partitions to Topic, up to GrowTo (0: none).
	GrowTo int32
}

func (f KafkaFault) String() string {
	switch {
	case f.Move:
		return fmt.Sprintf("burst %d: the leader of %s/%d moves to broker %d", f.At, f.MoveTopic, f.MovePartition, f.MoveTo)
	case f.Rehash:
		return fmt.Sprintf("burst %d: the transaction coordinators move", f.At)
	case f.GrowTo > 0:
		return fmt.Sprintf("burst %d: %s grows to %d partitions", f.At, Topic, f.GrowTo)
	}
	if f.Cut {
		return fmt.Sprintf("burst %d: the broker cuts the connection of %d %s requests", f.At, f.Count, f.Key.Name())
	}
	if f.Err == nil {
		return fmt.Sprintf("burst %d: the broker pauses %s before answering a %s", f.At, f.Delay, f.Key.Name())
	}
	return fmt.Sprintf("burst %d: %s fails %d× with %s", f.At, f.Key.Name(), f.Count, f.Err.Message)
}

// Delivery is the delivery mode a seed runs in: its parity picks it, so
// that a seed alone names a run.
func Delivery(seed uint64) string {
	if seed%2 == 1 {
		return publisher.ExactlyOnce
	}
	return publisher.AtLeastOnce
}

// NewPlan draws a run's workload and fault schedule from one seed
// (math/rand/v2's PCG). Broker faults of the transaction protocol are
// drawn only for exactly-once runs, which send those requests.
func NewPlan(seed uint64, sz Sizes, delivery string) *Plan {
	txnal := delivery == publisher.ExactlyOnce
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &Plan{Seed: seed, Sizes: sz}
	id := int64(1)
	for range sz.Txns {
		n := 1 + r.IntN(sz.MaxRows)
		rows := make([]Row, n)
		for j := range rows {
			size := 8 + r.IntN(400)
			if r.IntN(20) == 0 {
				size = 4000 + r.IntN(30000)
			}
			rows[j] = Row{ID: id, Key: fmt.Sprintf("agg-%d", r.IntN(sz.Keys)), Topic: Topic,
				Payload: fmt.Sprintf(`{"id": %d, "pad": "%s"}`, id, strings.Repeat("x", size))}
			id++
		}
		p.Txns = append(p.Txns, rows)
		p.Rel = append(p.Rel, r.IntN(10) == 0)
		idle := 0
		if r.IntN(3) == 0 {
			idle = 0x100 * (1 + r.IntN(32))
		}
		p.Idle = append(p.Idle, idle)
	}
	// Burst boundaries: sorted distinct starts, the first at 0.
	starts := map[int]bool{0: true}
	for len(starts) < min(sz.Bursts, sz.Txns) {
		starts[r.IntN(sz.Txns)] = true
	}
	for i := range sz.Txns {
		if starts[i] {
			p.Bursts = append(p.Bursts, i)
			p.Pause = append(p.Pause, time.Duration(r.IntN(60))*time.Millisecond)
		}
	}
	// Messages a session is sent: a fault point is drawn below that, so
	// most faults fire inside the stream rather than after its end.
	span := sz.Txns * (3 + sz.MaxRows) / 3
	for range sz.ConnFaults {
		var f ConnFault
		switch k := r.IntN(20); {
		case k < 10:
			f = ConnFault{Kind: FaultDrop, After: r.IntN(span), Hard: r.IntN(3) == 0}
		case k < 16:
			f = ConnFault{Kind: FaultSetup, Stage: Stage(r.IntN(int(numStages)))}
		case k < 17:
			f = ConnFault{Kind: FaultStall, After: r.IntN(span)}
		case k < 18:
			f = ConnFault{Kind: FaultSetupStall, Stage: Stage(r.IntN(int(StageCopyBoth)))}
		default:
			// a connection spared: faults are not back to back
		}
		f.HoldSlot = f.Kind != FaultNone && r.IntN(5) == 0
		p.Conn = append(p.Conn, f)
	}
	for range sz.KafkaFaults {
		f := KafkaFault{At: r.IntN(len(p.Bursts)), Count: 1 + r.IntN(3)}
		k := r.IntN(10)
		if !txnal && (k >= 3 && k < 7 || k == 9) {
			k = []int{0, 1, 2, 7, 8}[r.IntN(5)]
		}
		switch {
		case k < 3:
			f.Key = kmsg.Produce
			f.Err = []*kerr.Error{kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicas}[r.IntN(3)]
		case k < 5:
			f.Key = kmsg.EndTxn
			f.Err = []*kerr.Error{kerr.CoordinatorNotAvailable, kerr.NotCoordinator, kerr.ConcurrentTransactions}[r.IntN(3)]
		case k < 7:
			f.Key = kmsg.AddPartitionsToTxn
			f.Err = []*kerr.Error{kerr.ConcurrentTransactions, kerr.CoordinatorLoadInProgress, kerr.NotCoordinator}[r.IntN(3)]
		case k < 9:
			f.Key, f.Delay, f.Count = kmsg.Produce, time.Duration(50+r.IntN(400))*time.Millisecond, 1
		default:
			f.Key, f.Delay, f.Count = kmsg.EndTxn, time.Duration(50+r.IntN(400))*time.Millisecond, 1
		}
		p.Kafka = append(p.Kafka, f)
	}
	for range sz.MoreKafkaFaults {
		f := KafkaFault{At: r.IntN(len(p.Bursts)), Count: 1 + r.IntN(2)}
		k := r.IntN(12)
		if !txnal && (k == 1 || k == 5 || k == 8) {
			k = []int{0, 2, 3, 4, 6, 7, 9, 10, 11}[r.IntN(9)]
		}
		switch k {
		case 0: // the idempotent or transactional producer's set-up
			f.Key = kmsg.InitProducerID
			f.Err = []*kerr.Error{kerr.CoordinatorLoadInProgress, kerr.CoordinatorNotAvailable, kerr.ConcurrentTransactions}[r.IntN(3)]
		case 1:
			f.Key = kmsg.FindCoordinator
			f.Err = []*kerr.Error{kerr.CoordinatorLoadInProgress, kerr.CoordinatorNotAvailable}[r.IntN(2)]
		case 2: // the checkpoint read finds the end of the topic
			f.Key, f.Err = kmsg.ListOffsets, kerr.NotLeaderForPartition
		case 3: // and reads it
			f.Key, f.Err = kmsg.Fetch, []*kerr.Error{kerr.NotLeaderForPartition, kerr.UnknownLeaderEpoch}[r.IntN(2)]
		case 4: // applied, then answered with an error: the retry is a duplicate the broker drops
			f.Key, f.Err = kmsg.Produce, kerr.NotEnoughReplicasAfterAppend
		case 5:
			f.Key, f.Cut = kmsg.EndTxn, true
		case 6, 7:
			f.Key, f.Cut = kmsg.Produce, true
		case 8:
			f.Key, f.Cut = kmsg.AddPartitionsToTxn, true
		case 9:
			f.Key, f.Cut = kmsg.Fetch, true
		case 10:
			f.Key, f.Cut = kmsg.InitProducerID, true
		default:
			f.Key, f.Cut = kmsg.Metadata, true
		}
		p.Kafka = append(p.Kafka, f)
	}
	// Drawn last, for the same reason as MoreKafkaFaults.
	for i := range p.Conn {
		if p.Conn[i].Kind != FaultNone && r.IntN(4) == 0 {
			p.Conn[i].Crash = true
		}
	}
	if sz.Messages {
		p.addMessages(r)
	}
	for range sz.Moves {
		if sz.Brokers < 2 {
			break
		}
		f := KafkaFault{At: r.IntN(len(p.Bursts)), MoveTo: r.Int32N(sz.Brokers)}
		switch k := r.IntN(5); {
		case k < 3:
			f.Move, f.MoveTopic, f.MovePartition = true, Topic, r.Int32N(sz.Partitions)
		case k < 4:
			f.Move, f.MoveTopic = true, CheckpointTopic
		default:
			f.Rehash = true
		}
		p.Kafka = append(p.Kafka, f)
	}
	if sz.BadRows {
		p.addBadRows(r)
	}
	if sz.BigTxn >= 1000 && r.IntN(8) == 0 {
		p.addBigTxn(r)
	}
	if sz.Grow && r.IntN(4) == 0 {
		p.Kafka = append(p.Kafka, KafkaFault{At: r.IntN(len(p.Bursts)), GrowTo: sz.Partitions + 1 + r.Int32N(3)})
	}
	// The coordinator bumped the producer's epoch (as it does when it
	// aborts a transaction past its timeout): the open Kafka transaction
	// is gone, and the session must restart without losing or doubling a
	// PostgreSQL transaction.
	if sz.EpochBumps && txnal && r.IntN(4) == 0 {
		keys := []kmsg.Key{kmsg.Produce, kmsg.AddPartitionsToTxn, kmsg.EndTxn}
		p.Kafka = append(p.Kafka, KafkaFault{At: r.IntN(len(p.Bursts)), Key: keys[r.IntN(len(keys))], Err: kerr.InvalidProducerEpoch, Count: 1})
	}
	p.Instances = 1
	if sz.Standby && r.IntN(3) == 0 {
		p.Instances = 2
	}
	if sz.BigMessages && r.IntN(4) == 0 {
		i := r.IntN(len(p.Txns))
		m := Row{Kind: RowBigEmit, Key: fmt.Sprintf("agg-%d", r.IntN(sz.Keys)), Topic: Topic}
		if r.IntN(2) == 0 {
			m.Kind = RowForged
		}
		m.Payload = fmt.Sprintf(`{"big": %d, "pad": "%s"}`, i, strings.Repeat("z", 1_200_000))
		p.Txns[i] = slices.Insert(p.Txns[i], r.IntN(len(p.Txns[i])+1), m)
	}
	return p
}

// addBadRows puts a bad event into about one transaction in ten: a row
// whose topic is NULL (no default topic is set) or an outbox_emit message
// that sets a header outboxd sets. Both are dead-lettered.
func (p *Plan) addBadRows(r *rand.Rand) {
	next := p.maxID() + 1
	for i, rows := range p.Txns {
		if r.IntN(10) != 0 {
			continue
		}
		b := Row{Key: fmt.Sprintf("agg-%d", r.IntN(p.Sizes.Keys)), Payload: fmt.Sprintf(`{"bad": %d}`, i)}
		if r.IntN(2) == 0 {
			b.Kind, b.ID = RowBadTopic, next
			next++
		} else {
			b.Kind, b.Topic = RowBadEmit, Topic
		}
		p.Txns[i] = slices.Insert(rows, r.IntN(len(rows)+1), b)
	}
}

// addBigTxn makes one transaction 1,000 to Sizes.BigTxn rows long: far
// more than the in-flight budget holds, so a session reads it under
// backpressure, and a cut or a crash lands inside it.
func (p *Plan) addBigTxn(r *rand.Rand) {
	i := r.IntN(len(p.Txns))
	n := 1000 + r.IntN(p.Sizes.BigTxn-999)
	id := p.maxID() + 1
	rows := p.Txns[i]
	for j := range n {
		rows = append(rows, Row{ID: id + int64(j), Key: fmt.Sprintf("agg-%d", r.IntN(p.Sizes.Keys)), Topic: Topic,
			Payload: fmt.Sprintf(`{"id": %d, "big": true}`, id+int64(j))})
	}
	p.Txns[i] = rows
}

// maxID is the highest table row id of the workload.
func (p *Plan) maxID() int64 {
	var m int64
	for _, t := range p.Txns {
		for _, r := range t {
			if !r.message() {
				m = max(m, r.ID)
			}
		}
	}
	return m
}

// addMessages puts logical decoding messages into about a quarter of the
// transactions, at random places among their rows: mostly outbox_emit's
// (events), some forged, replayed or of another prefix (never events).
// Drawn after everything else, so that a seed's rows and faults are those
// it drew without them; only the WAL positions move.
func (p *Plan) addMessages(r *rand.Rand) {
	for i, rows := range p.Txns {
		if r.IntN(4) != 0 {
			continue
		}
		for range 1 + r.IntN(2) {
			m := Row{Key: fmt.Sprintf("agg-%d", r.IntN(p.Sizes.Keys)), Topic: Topic}
			switch k := r.IntN(20); {
			case k < 12:
				m.Kind = RowEmit
			case k < 15:
				m.Kind = RowForged
			case k < 18:
				m.Kind = RowReplayed
			default:
				m.Kind = RowForeign
			}
			size := 8 + r.IntN(400)
			if m.Kind == RowForeign && r.IntN(2) == 0 {
				size = 40000 + r.IntN(200000) // spans many reads of the frame filter
			}
			m.Payload = fmt.Sprintf(`{"emitted": %d, "pad": "%s"}`, i, strings.Repeat("y", size))
			at := r.IntN(len(rows) + 1)
			rows = slices.Insert(rows, at, m)
		}
		p.Txns[i] = rows
	}
}

// ConnFault is the fault scripted for connection n.
func (p *Plan) ConnFault(n int) ConnFault {
	if n < len(p.Conn) {
		return p.Conn[n]
	}
	return ConnFault{}
}

// Events is the number of events: outbox rows and outbox_emit's messages.
func (p *Plan) Events() int {
	n := 0
	for _, t := range p.Txns {
		for _, r := range t {
			if r.Event() {
				n++
			}
		}
	}
	return n
}

// burstTxns is the range of transactions of burst b.
func (p *Plan) burstTxns(b int) (from, to int) {
	from, to = p.Bursts[b], len(p.Txns)
	if b+1 < len(p.Bursts) {
		to = p.Bursts[b+1]
	}
	return from, to
}
