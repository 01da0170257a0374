// Package sim runs the whole CDC pipeline in one process and goes looking
// for the seams between its parts: the real publisher.Service, wired by
// publisher.NewKafkaService as outboxd run wires it (replication.Stream and
// its decoder, the Pipeline, the confirmation gate and the delivery modes —
// at-least-once with checkpoints, or exactly-once — and kafka.Producer),
// against a scripted walsender (Walsender: the replication protocol over
// loopback TCP, a WAL of committed pgoutput transactions and one slot) and
// kfake, franz-go's in-process Kafka.
//
// One seed (math/rand/v2's PCG) draws the workload — transactions of 1 to
// N rows, keys from a small set so that per-key order is tested, payload
// sizes, idle WAL of other tables between transactions, a table described
// again mid-stream, logical decoding messages among the rows: outbox_emit's
// (signed and bound to their transaction: events), forged ones, authentic
// content emitted again in another transaction, and other prefixes' of up
// to 240 KB; bad events (a NULL topic, a reserved header) for the
// dead-letter topic; in one seed in eight a transaction of 1,000 to 10,000
// rows, far past the in-flight budget — and the fault schedule. Each
// replication connection, in accept order, may be dropped at a set-up
// boundary (before the startup answer, IDENTIFY_SYSTEM, the slot query or
// START_REPLICATION is answered, right after CopyBothResponse while the
// session sets up, at the first status update) or stalled there, dropped
// after any number of WAL messages (inside a transaction, between Begin
// and its first row, between transactions; at the boundary, or hard, as a
// crash that loses what the client had not read), or stalled mid-stream;
// the slot may stay held for a moment by the dropped connection, and a
// drop may be a server crash that forgets what was confirmed since the
// last checkpoint. The broker (three kfake nodes) answers produce, fetch,
// metadata, producer-id and transaction requests with retriable errors,
// pauses or cuts the connection, and moves partition leaders (the
// checkpoint partition's too) and transaction coordinators. The seed's
// parity picks the delivery mode, so a seed alone names a run.
//
// The schedule is finite (a fault per scripted connection, a count per
// broker fault), so the faults stop. After the last burst of the workload
// the run waits, bounded, for the slot's confirmed position to reach the
// WAL's end (the progress invariant: a hang fails with a dump of every
// goroutine), stops the service, and checks what a read_committed consumer
// sees (check): nothing confirmed that is not in Kafka, no record of a
// message that is not an event, every bad event in the dead-letter topic,
// every event delivered (exactly once, and no PostgreSQL transaction torn, in
// exactly-once mode), and per-key order of first deliveries. The walsender
// checks on its own that no connection confirms past what it was sent.
//
// Full determinism is not possible with real goroutines, real TCP and a
// real clock: the seed fixes the workload and the fault schedule (which
// message boundary of which connection, which request), not the
// interleaving of the goroutines or where a hard drop's reset cuts, so a
// failing seed replays the same faults and usually, not always, the same
// failure. Replay one with
//
//	go test ./internal/sim -run TestSim -sim.seed=N -v
//
// (-sim.verbose adds the service's log), and run many with make sim SEEDS=N
// (side by side: a run waits on its timers and faults far more than it
// computes, so SIM_PARALLEL runs at once take about the CPU of one).
package sim
