package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
)

// Options configure one run.
type Options struct {
	Seed uint64
	// Delivery is publisher.AtLeastOnce (with checkpoints) or
	// publisher.ExactlyOnce; "" takes the seed's (Delivery).
	Delivery string
	Sizes    Sizes
	// Settle bounds the wait, once the workload is committed, for the slot
	// to confirm the WAL's end: the progress invariant. The fault schedule
	// is finite (a fault per scripted connection, a count per broker
	// fault): what is left of it when the workload ends fires in the
	// first part of the wait, then the faults have stopped.
	Settle time.Duration
	Log    *zap.Logger // nil: none
}

// Report is what a run found.
type Report struct {
	Seed     uint64
	Delivery string
	Took     time.Duration
	Txns     int
	Events   int
	Records  int // event records a read_committed reader saw
	// DeadLettered is the records of the dead-letter topic it saw.
	DeadLettered int
	// Instances is how many outboxd processes ran, Fenced how often one
	// was fenced by the other and started again.
	Instances, Fenced int
	Connections       int
	Confirmed         string // the slot's final confirmed position
	WALEnd            string
	Fired             []string // the faults that happened
	Ended             []string // how each walsender connection ended
	Violations        []string
	// Goroutines is a dump of every goroutine when the run did not
	// finish in time.
	Goroutines string
}

// Failed reports a violated invariant.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// Run runs the whole pipeline once against the scripted walsender and kfake:
// the seed's workload is committed in bursts while the faults fire, then
// the system settles, stops, and the invariants are checked.
func Run(opts Options) *Report {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Settle == 0 {
		opts.Settle = 30 * time.Second
	}
	if opts.Delivery == "" {
		opts.Delivery = Delivery(opts.Seed)
	}
	plan := NewPlan(opts.Seed, opts.Sizes, opts.Delivery)
	rep := &Report{Seed: opts.Seed, Delivery: opts.Delivery, Txns: len(plan.Txns), Events: plan.Events()}
	began := time.Now()
	defer func() { rep.Took = time.Since(began).Round(time.Millisecond) }()
	fail := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(int(max(1, opts.Sizes.Brokers))),
		kfake.SeedTopics(opts.Sizes.Partitions, Topic), kfake.SeedTopics(1, DeadLetterTopic))
	if err != nil {
		fail("start kfake: %v", err)
		return rep
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	ws, err := NewWalsender(plan.ConnFault)
	if err != nil {
		fail("start walsender: %v", err)
		return rep
	}
	defer ws.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, plan.Instances)
	var fenced atomic.Int64
	// runErr holds every instance's result, so none blocks on it: the
	// stop below waits for them, bounded.
	for i := range plan.Instances {
		log := opts.Log
		if plan.Instances > 1 {
			log = log.Named(fmt.Sprintf("instance-%d", i))
		}
		go func() {
			runErr <- runInstance(ctx, opts.Delivery, ws.ConnString(), brokers, log, &fenced)
		}()
	}

	// The workload, burst by burst, with the broker faults of each burst.
	var kfaults []*injected
	ended := false // the service's Run returned early
	for b := range plan.Bursts {
		for _, f := range plan.Kafka {
			if f.At == b {
				kfaults = append(kfaults, injectKafka(cluster, f))
			}
		}
		from, to := plan.burstTxns(b)
		for i := from; i < to; i++ {
			ws.Commit(plan.Txns[i], plan.Idle[i], plan.Rel[i])
		}
		select {
		case err := <-runErr:
			fail("the service stopped on its own while the workload ran: %v", err)
			ended = true
		case <-time.After(plan.Pause[b]): // the workload's pacing, not a synchronisation
		}
		if ended {
			break
		}
	}
	if !ended {
		if err := settle(ws, runErr, opts.Settle); err != nil {
			fail("progress: %v", err)
			if !errors.Is(err, errServiceEnded) {
				rep.Goroutines = goroutines()
			}
			if errors.Is(err, errServiceEnded) {
				ended = true
			}
		}
	}
	// What is left of the schedule goes: the stop and the reader below
	// meet a broker that answers.
	for _, in := range kfaults {
		in.remove()
		ws.note("kafka: %s: answered %d", in.f, in.hits())
	}
	cancel()
	left := plan.Instances
	if ended {
		left-- // its Run returned already
	}
	stopBy := time.After(15 * time.Second)
	for ; left > 0; left-- {
		select {
		case err := <-runErr:
			if err != nil {
				fail("the service's Run returned %v after a stop, want nil", err)
			}
		case <-stopBy:
			fail("progress: the service did not stop within 15 s of its context's cancellation")
			if rep.Goroutines == "" {
				rep.Goroutines = goroutines()
			}
			left = 0
		}
	}
	confirmed, _ := ws.Confirmed()
	rep.Confirmed, rep.WALEnd = confirmed.String(), ws.WALEnd().String()
	rep.Connections = ws.Connections()
	rep.Instances, rep.Fenced = plan.Instances, int(fenced.Load())
	rep.Fired = ws.Fired()
	rep.Ended = ws.Ended()
	for _, p := range ws.Problems() {
		fail("walsender: %s", p)
	}

	parts := opts.Sizes.Partitions
	for _, in := range kfaults {
		if in.f.GrowTo > 0 && in.hits() > 0 {
			parts = max(parts, in.f.GrowTo)
		}
	}
	recs, err := readTopic(brokers, Topic, parts)
	if err != nil {
		fail("read the topic: %v", err)
	}
	dead, err := readTopic(brokers, DeadLetterTopic, 1)
	if err != nil {
		fail("read the dead-letter topic: %v", err)
	}
	rep.Records, rep.DeadLettered = len(recs), len(dead)
	for _, v := range check(ws.Txns(), confirmed, recs, dead, opts.Delivery == publisher.ExactlyOnce, keyPartition(opts.Sizes.Partitions)) {
		fail("%s", v)
	}
	return rep
}

var errServiceEnded = errors.New("the service stopped on its own")

// runInstance runs one outboxd process until ctx ends. A process fenced by
// a newer producer of the same slot (the other instance took over in
// exactly-once mode) exits, and its supervisor (systemd, Kubernetes)
// starts it again, as a standby: so here. Any other return is what Run
// returned.
func runInstance(ctx context.Context, delivery, connString string, brokers []string, log *zap.Logger, fenced *atomic.Int64) error {
	for {
		svc := publisher.NewKafkaService(serviceConfig(delivery), publisher.Wiring{
			Stream: streamConfig(connString), Kafka: kafkaConfig(brokers),
		}, log, nil)
		err := svc.Run(ctx)
		if !errors.Is(err, kafka.ErrFenced) || ctx.Err() != nil {
			return err
		}
		fenced.Add(1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond): // the supervisor's restart delay
		}
	}
}

// settle waits until the slot confirmed the WAL's end, at most d.
func settle(ws *Walsender, runErr <-chan error, d time.Duration) error {
	deadline := time.After(d)
	for {
		confirmed, moved := ws.Confirmed()
		end := ws.WALEnd()
		if confirmed >= end {
			return nil
		}
		select {
		case <-moved:
		case err := <-runErr:
			return fmt.Errorf("%w before it confirmed the WAL's end %s (at %s): %v", errServiceEnded, end, confirmed, err)
		case <-deadline:
			return fmt.Errorf("the slot confirmed %s, not the WAL's end %s, within %s of the workload's end: a hang (see the goroutines)", confirmed, end, d)
		}
	}
}

func goroutines() string {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}

func serviceConfig(delivery string) publisher.Config {
	c := publisher.DefaultConfig()
	c.Delivery = delivery
	c.CheckpointTopic = CheckpointTopic
	c.DeadLetterTopic = DeadLetterTopic
	c.CheckpointInterval = 50 * time.Millisecond
	c.TxnMaxAge = 20 * time.Millisecond
	c.RestartBackoffMin = 10 * time.Millisecond
	c.RestartBackoffMax = 100 * time.Millisecond
	c.ShutdownTimeout = 5 * time.Second
	c.StandbyPollInterval = 100 * time.Millisecond
	// A small in-flight budget: reading pauses on it (backpressure) in
	// the bigger bursts.
	c.MaxInFlightEvents = 64
	c.MaxInFlightBytes = 256 << 10
	return c
}

func streamConfig(connString string) replication.StreamConfig {
	c := replication.DefaultStreamConfig()
	c.ConnString = connString
	// As outboxd run's default source (the table and outbox_emit's
	// messages): the session reads the key from the walsender.
	c.Decoder.Messages = true
	// Status updates every 10 ms: the set-up keepalive sends several while
	// a session sets up, and the settle wait sees progress soon.
	c.StatusInterval = 10 * time.Millisecond
	// A stalled walsender is noticed in a second.
	c.ServerTimeout = time.Second
	c.ConnectTimeout = 3 * time.Second
	return c
}

func kafkaConfig(brokers []string) kafka.Config {
	c := kafka.DefaultConfig()
	c.Brokers = brokers
	c.RetryBackoff = 2 * time.Millisecond
	c.RetryBackoffMax = 20 * time.Millisecond
	c.DeliveryTimeout = 5 * time.Second
	c.RequestTimeout = 2 * time.Second
	c.UnknownTopicTimeout = time.Second
	c.CheckpointReadTimeout = 5 * time.Second
	// A grown topic is seen within a fraction of a burst.
	c.MetadataRefresh = 100 * time.Millisecond
	c.TransactionTimeout = 20 * time.Second
	return c
}

// injected is one installed broker fault.
type injected struct {
	f    KafkaFault
	h    *kfake.FaultHandle // an error fault's
	cuts atomic.Int64       // connections cut, or pauses
	off  atomic.Bool        // removed: a control answers as usual
}

// remove takes the fault out, what is left of its count unused.
func (in *injected) remove() {
	in.off.Store(true)
	if in.h != nil {
		in.h.Remove()
	}
}

// hits is how many requests the fault answered.
func (in *injected) hits() int {
	if in.h != nil {
		return in.h.Hits()
	}
	return int(in.cuts.Load())
}

// injectKafka installs one broker fault.
func injectKafka(c *kfake.Cluster, f KafkaFault) *injected {
	in := &injected{f: f}
	switch {
	case f.Move:
		// The checkpoint topic exists once a session created it: a move
		// before that finds no partition and does nothing (hits 0).
		if c.MoveTopicPartition(f.MoveTopic, f.MovePartition, f.MoveTo) == nil {
			in.cuts.Store(1)
		}
	case f.Rehash:
		c.RehashCoordinators()
		in.cuts.Store(1)
	case f.GrowTo > 0:
		if growTopic(c.ListenAddrs(), f.GrowTo) == nil {
			in.cuts.Store(1)
		}
	case f.Cut:
		left := int64(f.Count)
		c.ControlKey(int16(f.Key), func(kmsg.Request) (kmsg.Response, error, bool) {
			if left == 0 || in.off.Load() {
				return nil, nil, false
			}
			left--
			in.cuts.Add(1)
			c.KeepControl()
			return nil, errCut, true // kfake closes the connection
		})
	case f.Err != nil:
		top := f.Key == kmsg.EndTxn || f.Key == kmsg.InitProducerID
		in.h = c.Fault(kfake.Fault{Keys: []kmsg.Key{f.Key}, Err: f.Err, Count: f.Count, TopLevel: top})
	default:
		// The whole broker pauses before it answers the next such request
		// (a GC pause, a slow disk): its cluster goroutine waits in the
		// control function. kfake's SleepControl, which would delay that
		// request alone, races on its own state (go test -race reports it
		// inside kfake).
		c.ControlKey(int16(f.Key), func(kmsg.Request) (kmsg.Response, error, bool) {
			if !in.off.Load() && in.cuts.CompareAndSwap(0, 1) {
				<-time.After(f.Delay)
			}
			return nil, nil, false // then answered as usual
		})
	}
	return in
}

var errCut = errors.New("sim: connection cut")

// growTopic adds partitions to Topic, as kafka-topics --alter does.
func growTopic(brokers []string, to int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreatePartitionsRequest()
	t := kmsg.NewCreatePartitionsRequestTopic()
	t.Topic, t.Count = Topic, to
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}

// keyPartition is the partition a key is routed to among n, as outboxd
// routes it (the Java client's murmur2).
func keyPartition(n int32) func(key string) int32 {
	part := kafka.NewJavaPartitioner("")
	return func(key string) int32 {
		p, _ := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, n)
		return p
	}
}

// record is one event record as a consumer sees it.
type record struct {
	partition int32
	offset    int64
	key       string
	id        int64
	value     string
}

// readTopic reads every record of topic as a read_committed consumer does. To know it read to the end it first writes a sentinel to every
// partition, outside any transaction: a read_committed reader reaches it
// only once every transaction before it ended, so an open transaction left
// behind shows as a partition that never reaches its sentinel.
func readTopic(brokers []string, topic string, partitions int32) ([]record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	for p := range partitions {
		r := &kgo.Record{Topic: topic, Partition: p, Value: []byte("sentinel"), Headers: []kgo.RecordHeader{{Key: "sim-sentinel"}}}
		if err := pcl.ProduceSync(ctx, r).FirstErr(); err != nil {
			pcl.Close()
			return nil, fmt.Errorf("write the sentinel of partition %d: %w", p, err)
		}
	}
	pcl.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// kfake can hold a first Fetch for its whole max wait (see the
		// kafka package's readCommitted): keep it short.
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []record
	reached := map[int32]bool{}
	for int32(len(reached)) < partitions {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			var missing []int32
			for p := range partitions {
				if !reached[p] {
					missing = append(missing, p)
				}
			}
			return out, fmt.Errorf("partitions %v never reached their sentinel within 15 s: a transaction left open hides everything after it", missing)
		}
		var perr error
		fs.EachError(func(_ string, p int32, err error) { perr = fmt.Errorf("partition %d: %w", p, err) })
		if perr != nil {
			return out, perr
		}
		fs.EachRecord(func(r *kgo.Record) {
			rec := record{partition: r.Partition, offset: r.Offset, key: string(r.Key), value: string(r.Value), id: -1}
			for _, h := range r.Headers {
				switch h.Key {
				case "sim-sentinel":
					reached[r.Partition] = true
					return
				case "outbox-id", kafka.HeaderDLQEventID:
					if id, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
						rec.id = id
					}
				}
			}
			out = append(out, rec)
		})
	}
	return out, nil
}
