package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/retention"
	"github.com/outboxd/outboxd/slot"
)

// options are every setting of every command; each command registers the
// flags it uses.
type options struct {
	pgDSN    string
	slot     slot.Config
	logLevel string
	logJSON  bool

	// run
	brokers         string
	kafkaVersion    string
	compression     string
	linger          time.Duration
	deliveryTimeout time.Duration
	kafkaTopics     kafkaTopicOpts
	stallTimeout    time.Duration
	retention       retention.Config
	maxMessageBytes int
	maxRequestBytes int
	statusInterval  time.Duration
	serverTimeout   time.Duration
	noCreate        bool
	startTimeout    time.Duration
	auditInterval   time.Duration
	auditDelay      time.Duration
	metricsAddr     string
	pprof           bool
	pub             publisher.Config
	shapeOpts       shapeOptions // shape.go
	decoder         replication.DecoderConfig
	poll            pollOptions // --source=poll: poll.go
	kafkaSec        kafka.Security
	slotPoll        time.Duration
	hooks           stringList
	formats         formatOpts // formatflags.go

	// slot drop
	dropPublication bool
}

func newFlagSet(name string, o *options) *flagSet {
	fs := newSettings("outboxd " + name)
	*o = options{slot: slot.DefaultConfig(), pub: publisher.DefaultConfig()}
	fs.StringVar(&o.pgDSN, "pg-dsn", "", "PostgreSQL connection string (URL or key=value); the role needs REPLICATION", inPG, secret, redactWith(redactDSN),
		doc("PostgreSQL connection string (URL or key=value); the role needs `REPLICATION`"))
	fs.StringVar(&o.slot.Slot, "slot", o.slot.Slot, "logical replication slot (pgoutput), cluster-wide name", inPG)
	fs.StringVar(&o.slot.Publication, "publication", o.slot.Publication, "publication of the outbox table", inPG)
	fs.StringVar(&o.slot.Schema, "schema", o.slot.Schema, "schema of the outbox table", inPG)
	fs.StringVar(&o.slot.Table, "table", o.slot.Table, "outbox table", inPG)
	fs.BoolVar(&o.slot.Failover, "failover-slot", o.slot.Failover, "create the slot as a failover slot (synced to standbys with sync_replication_slots) when PostgreSQL is 17 or later", inPG,
		doc("create the slot as a failover slot (synced to standbys with `sync_replication_slots`) when PostgreSQL is 17 or later ([failover slots](postgres.md))"))
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error", inOps, choices("debug", "info", "warn", "error"))
	fs.BoolVar(&o.logJSON, "log-json", false, "log as JSON lines instead of console text", inOps)
	fs.String(configFlag, "", "YAML file of settings, keys named like the flags (precedence: flag > env > file > default)", inOps, cliOnly,
		doc("YAML file of settings, keys named like the flags ([above](#where-settings-come-from)); on the command line or as `OUTBOXD_CONFIG`"))
	return fs
}

// runFlags are the flags of run, the settings every command that publishes
// takes.
func runFlags(o *options) *flagSet {
	fs := newFlagSet("run", o)
	addRunFlags(fs, o)
	return fs
}

func addRunFlags(fs *flagSet, o *options) {
	k := kafka.DefaultConfig()
	fs.StringVar(&o.brokers, "kafka-brokers", "", "Kafka bootstrap brokers, host:port[,host:port...]", inKafka,
		doc("Kafka bootstrap brokers, `host:port[,host:port...]`; a config file may give a list"))
	fs.StringVar(&o.kafkaVersion, "kafka-version", k.Version.String(), "Kafka protocol version to speak (Kafka 4 needs ≥ 2.1)", inKafka)
	fs.StringVar(&o.compression, "kafka-compression", k.Compression, "record compression: none, gzip, snappy, lz4, zstd", inKafka,
		choices("none", "gzip", "snappy", "lz4", "zstd"))
	fs.DurationVar(&o.linger, "kafka-linger", k.Linger, "wait up to this long to batch records (0: send as soon as the previous request returns)", inKafka)
	fs.DurationVar(&o.deliveryTimeout, "kafka-delivery-timeout", k.DeliveryTimeout, "how long an event may stay undelivered from its first send (broker down or not answering, no leader, not enough replicas) before the pipeline restarts; until then the same batch is sent again, in order and without duplicates", inKafka,
		doc("how long an event may stay undelivered from its first send (broker down or not answering, no leader, not enough replicas) before the pipeline restarts; until then the same batch is sent again, in order and without duplicates ([guarantees](guarantees.md#per-aggregate-order))"))
	o.kafkaTopics.addFlags(fs, k)
	bytesIntVar(fs, &o.maxMessageBytes, "kafka-max-message-bytes", k.MaxMessageBytes, "largest record to produce; larger ones are poison events", inKafka,
		doc("largest record to produce; larger ones are poison events (dead-letter topic, or halt). Also the largest record batch; lowered at start to the brokers' `message.max.bytes` when they report a smaller one (DescribeConfigs)"))
	bytesIntVar(fs, &o.maxRequestBytes, "kafka-max-request-bytes", k.MaxRequestBytes, "largest produce request (all its batches); lowered to the brokers' socket.request.max.bytes when they report a smaller one", inKafka,
		doc("largest produce request (all its batches); lowered at start to the brokers' `socket.request.max.bytes` when they report a smaller one. Without permission to describe the brokers' configs, the flags stand"))
	fs.DurationVar(&o.statusInterval, "status-interval", time.Second, "interval of standby status updates to PostgreSQL (< wal_sender_timeout)", inPG,
		doc("interval of standby status updates to PostgreSQL (keep it < `wal_sender_timeout`)"))
	fs.DurationVar(&o.serverTimeout, "server-timeout", replication.DefaultStreamConfig().ServerTimeout, "restart the replication session when PostgreSQL sends nothing for this long, not even the keepalive asked for at half of it (half-open connection, stopped server)", inPG,
		doc("restart the replication session when PostgreSQL sends nothing for this long, not even the keepalive asked for at half of it (half-open connection, stopped server): the replication watchdog. 60 s is PostgreSQL's own `wal_receiver_timeout` default; a busy walsender decoding a large transaction may take up to `wal_sender_timeout`/2 (30 s) to answer, so 30 s or less could restart sessions needlessly"))
	fs.DurationVar(&o.startTimeout, "start-timeout", defaultStartTimeout, "at start, how long to keep trying a Kafka or PostgreSQL that refuses or does not answer yet (or is starting up), once a second, each attempt logged; 0: the first failure ends the process. Wrong credentials, unknown hosts and missing tables end it at once", inOps,
		doc("at start, how long to keep trying a Kafka or PostgreSQL that refuses or does not answer yet (or is starting up), once a second, each attempt logged; 0: the first failure ends the process. Wrong credentials, unknown hosts and missing tables end it at once ([what fails fast](operations.md#what-fails-fast-what-is-retried))"))
	fs.BoolVar(&o.noCreate, "no-create", false, "fail instead of creating a missing slot or publication", inPG)
	fs.DurationVar(&o.stallTimeout, "stall-timeout", 30*time.Second, "with --metrics-addr: /readyz answers 503 while events have waited this long for Kafka with none acknowledged", inOps,
		doc("with `--metrics-addr`: `/readyz` answers 503 while events have waited this long for Kafka with none acknowledged"))
	o.retention = retention.DefaultConfig()
	fs.DurationVar(&o.retention.OlderThan, "retention", 0, "delete outbox rows older than this, in batches off the hot path (0: never; their INSERTs are in WAL already, so CDC loses nothing; keep them as long as a replay may need them)", inOps,
		doc("delete outbox rows older than this, in batches of 1,000, off the hot path; CDC loses nothing by it (events come from WAL); replay needs the rows; 0: off ([README › Retention](../README.md#retention))"))
	fs.DurationVar(&o.retention.Interval, "retention-interval", o.retention.Interval, "with --retention: how often to delete", inOps)
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address (e.g. :9652); empty: off", inOps,
		doc("serve `/metrics`, `/healthz` and `/readyz` on this address (e.g. `:9652`); empty: off"))
	fs.BoolVar(&o.pprof, "pprof", false, "with --metrics-addr: also serve Go's profiler under /debug/pprof/ (CPU, heap, goroutines)", inOps,
		doc("with `--metrics-addr`: also serve Go's profiler under `/debug/pprof/` (e.g. `go tool pprof http://HOST:9652/debug/pprof/profile?seconds=10`)"))
	addPollFlags(fs, o)
	fs.DurationVar(&o.auditInterval, "audit-interval", 0, "audit continuously: every this long, the active instance checks the rows created since its last round against Kafka (the verdicts of outboxd audit) and exports outboxd_audit_*; 0: off", inOps,
		doc("audit continuously: every this long the active instance checks the rows created since its last round against Kafka (the verdicts of `outboxd audit`) and exports `outboxd_audit_*`; 0: off ([continuous audit](operations.md#continuous-audit))"))
	fs.DurationVar(&o.auditDelay, "audit-delay", time.Minute, "with --audit-interval: leave rows younger than this to a later round (a longer open transaction can show as missing once)", inOps)
	fs.DurationVar(&o.slotPoll, "slot-poll-interval", 10*time.Second, "with --metrics-addr: how often to read pg_replication_slots for the lag and retained-WAL metrics", inOps,
		doc("with `--metrics-addr`: how often to read `pg_replication_slots` for the lag and retained-WAL metrics"))
	addSecurityFlags(fs, &o.kafkaSec)
	fs.StringVar(&o.pub.DefaultTopic, "default-topic", "", "topic for rows without one (topic column absent or NULL, or a NULL placeholder of --topic-template)", inShape)
	addShapeFlags(fs, &o.shapeOpts)
	o.formats.addFlags(fs)
	fs.StringVar(&o.pub.Delivery, "delivery", o.pub.Delivery, "at-least-once, or exactly-once: Kafka transactions with the checkpoint inside, confirmed to PostgreSQL only after the commit (consumers must read read_committed)", inDelivery,
		choices(publisher.AtLeastOnce, publisher.ExactlyOnce),
		doc("`at-least-once`, or `exactly-once`: whole PostgreSQL transactions in Kafka transactions with the checkpoint inside, confirmed only after the commit; consumers must read `read_committed` ([delivery modes](guarantees.md#delivery-modes-at-least-once-and-exactly-once))"))
	fs.StringVar(&o.pub.CheckpointTopic, "checkpoint-topic", o.pub.CheckpointTopic, "compacted topic of outboxd's checkpoints (created when missing); replayed transactions below the checkpoint are skipped; empty: off (at-least-once only)", inDelivery,
		doc("compacted topic of outboxd's checkpoints (created when missing, one partition; an existing one with more partitions is refused at start, since the read barrier protects only the partition it lands on); replayed transactions below the checkpoint are skipped and a slot ahead of it is refused; empty: off (at-least-once only)"))
	fs.DurationVar(&o.pub.CheckpointInterval, "checkpoint-interval", o.pub.CheckpointInterval, "how often a checkpoint is written when nothing else writes one", inDelivery,
		doc("how often a checkpoint is written when nothing else writes one (an idle outbox while other tables write)"))
	fs.IntVar(&o.pub.TxnMaxEvents, "kafka-txn-max-events", o.pub.TxnMaxEvents, "exactly-once: close the Kafka transaction at the next Postgres commit once it holds this many events", inDelivery,
		doc("exactly-once: close the Kafka transaction at the next PostgreSQL commit once it holds this many events (a PostgreSQL transaction is never split)"))
	fs.DurationVar(&o.pub.TxnMaxAge, "kafka-txn-max-age", o.pub.TxnMaxAge, "exactly-once: close the Kafka transaction at the next Postgres commit once it is this old", inDelivery,
		doc("exactly-once: close the Kafka transaction at the next PostgreSQL commit once it is this old; it is also closed whenever no other PostgreSQL transaction is waiting"))
	fs.BoolVar(&o.pub.AcceptGap, "accept-gap", false, "start although the slot is ahead of the checkpoint or the checkpoint is another system's (events in between may be missing from Kafka)", inDelivery,
		doc("start once although the slot is ahead of the checkpoint, or the checkpoint is another PostgreSQL system's (events in between may be missing from Kafka): the checkpoint starts over at the slot; `outboxd replay --resume` sets it after republishing ([recovery](postgres.md#a-lost-slot-is-never-papered-over))"))
	fs.StringVar(&o.pub.DeadLetterTopic, "dead-letter-topic", "", "divert poison events (refused by Kafka for good) and bad events (rows that cannot become a record) here instead of halting", inDelivery,
		doc("divert poison events (refused by Kafka for good) and bad events (rows that cannot become a record) here instead of halting; the record keeps its key, value and headers and gets the project's dead-letter headers `dlq-error`, `dlq-error-class` (`poison`), `dlq-source-topic`, `dlq-payload-bytes` and, when the value was left out, `dlq-payload-omitted` (the same vocabulary as the consumer package's; the names before this release, `outboxd-error`, `outboxd-original-topic`, `outboxd-payload-bytes`, `outboxd-payload-omitted`, are still written beside them for one release)"))
	fs.Func("skip-bad-event", "LSN of a bad event to skip instead of halting on it (repeatable, or comma-separated; the halt's message gives the flags to use); an event at that LSN that is not bad is published", func(v string) error {
		for _, s := range strings.Split(v, ",") {
			lsn, err := pglogrepl.ParseLSN(strings.TrimSpace(s))
			if err != nil || lsn == 0 {
				return fmt.Errorf("%q is not an LSN: copy it from the halt's message, e.g. 0/16B3748", s)
			}
			o.pub.SkipBadEvents = append(o.pub.SkipBadEvents, lsn)
		}
		return nil
	}, inOps,
		doc("LSN of a bad event (a row that cannot become a record) to skip instead of halting on it; repeatable or comma-separated; the halt's message gives the exact flags. An event at that LSN that is not bad is published. Bad events go to `--dead-letter-topic` when it is set ([shapes.md](shapes.md#bad-events-dead-letter-or-skip-exactly-one))"))
	fs.IntVar(&o.pub.MaxInFlightEvents, "max-in-flight-events", o.pub.MaxInFlightEvents, "events produced and not yet acknowledged before reading pauses", inDelivery)
	bytesVar(fs, &o.pub.MaxInFlightBytes, "max-in-flight-bytes", o.pub.MaxInFlightBytes, "bytes produced and not yet acknowledged before reading pauses", inDelivery,
		doc("the memory budget: bytes of events read and not yet acknowledged by Kafka (or taken by the dead-letter topic) — handed over by the stream, held back, queued, batched, in requests, in an open exactly-once transaction — before reading from PostgreSQL pauses (status updates keep flowing). Each event costs its bytes + 512. One event larger than the budget still goes, alone. Peak RSS ≤ 2 × this + 24 MiB + the executable's size (≤ 2 × this + 64 MiB; run sets Go's soft memory limit to 2 × this + 24 MiB unless `GOMEMLIMIT` is set): README \"Memory\""))
	fs.DurationVar(&o.pub.ShutdownTimeout, "shutdown-timeout", o.pub.ShutdownTimeout, "on SIGINT/SIGTERM, wait this long for in-flight acknowledgements", inOps)
	fs.DurationVar(&o.pub.RestartBackoffMin, "restart-backoff-min", o.pub.RestartBackoffMin, "first backoff before restarting after an error", inOps)
	fs.DurationVar(&o.pub.RestartBackoffMax, "restart-backoff-max", o.pub.RestartBackoffMax, "cap of the exponential restart backoff", inOps)
	fs.DurationVar(&o.pub.StandbyPollInterval, "standby-poll-interval", o.pub.StandbyPollInterval, "how often a standby retries the slot (it also takes over as soon as it sees the slot released)", inOps,
		doc("how often a standby retries the slot; it also reads `pg_replication_slots` every 100 ms and takes over as soon as the active process lets go"))
	fs.Var(&o.hooks, "hook", "post-publish hook TOPIC=SQL (repeatable): runs after Kafka acked an event of TOPIC, before its LSN is confirmed; $1 aggregate_id, $2 outbox id, $3 payload; must be idempotent (a failure re-publishes and re-runs)", inOps,
		doc("post-publish hook `TOPIC=SQL` (repeatable; a config file may give a list): runs after Kafka acked an event of TOPIC, before its LSN is confirmed; `$1` aggregate_id, `$2` outbox id, `$3` payload; must be idempotent (a failure re-publishes and re-runs)"))
	fs.IntVar(&o.pub.CrashAfterProduce, "crash-after-produce", 0, "DEMO ONLY: exit hard (status 3) once Kafka acked this many events, before confirming them", inDemo)
}

// addSecurityFlags are package kafka's TLS and SASL flags, which the
// consumer package's programs share, with their entries in the table.
func addSecurityFlags(fs *flagSet, s *kafka.Security) {
	fs.adopt(s.AddFlags, []opt{inKafka}, map[string][]opt{
		"kafka-sasl-password":  {secret, doc("SASL password; prefer `OUTBOXD_KAFKA_SASL_PASSWORD` or `--kafka-sasl-password-file` to the command line, which `ps` shows ([Security](#security))")},
		"kafka-sasl-mechanism": {choices(sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512)},
	})
}

// parse parses args, then fills every flag not given on the command line
// from its OUTBOXD_* environment variable, else from the --config file.
func parse(fs *flagSet, args []string) error {
	warnUnknownEnv(os.Stderr, lookupEnvNames())
	_, err := parseSources(fs, args, os.LookupEnv)
	return err
}

// unexpectedArgs names where the arguments after the flags begin, not what
// they are: a flag given without its value shifts the next flag's value
// into them ("--kafka-brokers --pg-dsn postgres://u:pw@db" leaves the DSN
// over), and a bare password cannot be told from any other word.
func unexpectedArgs(fs *flagSet, args []string) error {
	rest := len(fs.Args())
	at := len(args) - rest
	where := "before any flag"
	for i := at - 1; i >= 0; i-- {
		if strings.HasPrefix(args[i], "-") {
			name, _, _ := strings.Cut(args[i], "=")
			where = "after " + name
			break
		}
	}
	noun := "argument"
	if rest > 1 {
		noun = "arguments"
	}
	return usageErrorf("%d unexpected %s %s (not shown: one may be a secret): a flag with its value missing, a flag without its leading --, or a value with spaces not quoted; see %q",
		rest, noun, where, fs.Name()+" --help")
}

// parseSources is parse, reporting where each setting came from.
func parseSources(fs *flagSet, args []string, lookupEnv func(string) (string, bool)) (map[string]string, error) {
	// The flag package's own messages go nowhere: help goes to stdout (exit
	// 0), a bad command line is one line on stderr (exit 2).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(os.Stdout, fs)
			return nil, errHelp
		}
		return nil, parseError(fs, err)
	}
	if fs.NArg() > 0 {
		return nil, unexpectedArgs(fs, args)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return resolve(fs, set, lookupEnv)
}

func envName(flagName string) string {
	return "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (o *options) validateCommon() error {
	var errs []error
	if o.pgDSN == "" {
		errs = append(errs, errors.New("no PostgreSQL connection: set --pg-dsn or OUTBOXD_PG_DSN"))
	}
	if err := o.slot.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (o *options) kafkaConfig() (kafka.Config, error) {
	k := kafka.DefaultConfig()
	for _, b := range strings.Split(o.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			k.Brokers = append(k.Brokers, b)
		}
	}
	v, err := sarama.ParseKafkaVersion(o.kafkaVersion)
	if err != nil {
		return k, fmt.Errorf("--kafka-version %q: %w", o.kafkaVersion, err)
	}
	k.Version = v
	k.Compression = o.compression
	k.Linger = o.linger
	k.DeliveryTimeout = o.deliveryTimeout
	if err := o.kafkaTopics.apply(&k, o.pub); err != nil {
		return k, err
	}
	k.MaxMessageBytes = o.maxMessageBytes
	k.MaxRequestBytes = o.maxRequestBytes
	k.Security = o.kafkaSec
	return k, k.Validate()
}

func (o *options) streamConfig() replication.StreamConfig {
	return replication.StreamConfig{
		ConnString:     o.pgDSN,
		Slot:           o.slot.Slot,
		Publication:    o.slot.Publication,
		StatusInterval: o.statusInterval,
		ServerTimeout:  o.serverTimeout,
		ConnectTimeout: replication.DefaultStreamConfig().ConnectTimeout,
		Decoder:        o.decoder,
	}
}

func (o *options) logger(w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(o.logLevel)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ecfg := zap.NewProductionEncoderConfig()
	ecfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if o.logJSON {
		enc = zapcore.NewJSONEncoder(ecfg)
	} else {
		ecfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ecfg)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl)), nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, "; ") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// newHook is the post-publish hook factory both sources use; nil when no
// --hook is set.
func (o *options) newHook() (func(context.Context) (outbox.Hook, error), error) {
	hooks, err := outbox.ParseHooks(o.hooks)
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	if len(hooks) == 0 {
		return nil, nil
	}
	return func(ctx context.Context) (outbox.Hook, error) {
		return outbox.NewSQLHooks(ctx, o.pgDSN, hooks)
	}, nil
}
