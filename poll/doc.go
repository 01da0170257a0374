// Package poll is the polling publisher: the alternative source for teams
// that cannot enable logical replication (outboxd run --source=poll).
//
// Each worker repeats one transaction:
//
//	SELECT id, aggregate_id, topic, payload, created_at FROM outbox
//	 WHERE published_at IS NULL ORDER BY id LIMIT $batch FOR UPDATE SKIP LOCKED;
//	-- produce every row (outbox.NewRecord: the key, headers, value and
//	-- timestamp CDC would give it) and wait until Kafka acknowledged all
//	UPDATE outbox SET published_at = now() WHERE id = ANY($ids);
//	COMMIT;
//
// A row is marked published only after Kafka acknowledged it, in the same
// transaction that locked it, so a crash or a Kafka failure rolls the batch
// back and it is sent again: at-least-once, like CDC. Several workers, or
// several processes, share the table: SKIP LOCKED hands each one different
// rows. After a batch that was not full, a worker waits until Interval has
// passed since that poll began; after a full batch it polls again at once.
//
// # What polling costs, and where its order differs from CDC
//
// Every poll is a query on the primary, also when there is nothing to
// publish, and every published row is updated once (a new heap tuple and
// index entries, WAL, later vacuum). The partial index that [Migrate] creates
// ("outboxd migrate --source=poll", with the published_at column) keeps a
// poll from scanning published rows. Latency is bounded below by the
// interval: a row waits on average Interval/2 for the next poll.
//
// Order. A row becomes visible to a poll when its transaction commits, not
// when its id was drawn. Ids come from a sequence at INSERT time, so a
// transaction that inserts id 7 and commits after another one inserted and
// committed id 8 is invisible to the poll that publishes 8; 7 is published
// by a later poll, after 8. Such a late-committing lower id is not lost
// (published_at, not an id watermark, says what is left), but consumers that
// treat the outbox id as a sequence (a "highest id seen" dedup, a gap check)
// will misjudge it. CDC delivers the same rows in commit order, which has the
// same property; the difference is that within one poll, rows that both
// committed are sent in id order, not commit order, and that the window grows
// with the interval. The benchmark (bench/) counts how many rows arrive after
// a higher id of the same partition and of the same key, for both sources.
//
// With one worker, the rows of a key reach Kafka in the order above. With
// several workers or processes, two batches are in flight at once and a
// key's later rows can be acknowledged before its earlier ones: per-key
// order then holds only if each key is written by one transaction at a time
// and no two batches hold the same key, which SKIP LOCKED does not ensure.
// Use one worker when consumers need per-key order.
package poll
