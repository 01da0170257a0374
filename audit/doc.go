// Package audit proves delivery: it compares the outbox rows still in the
// table with the Kafka records of their topics and reports, per topic, what
// outboxd's guarantees say must not happen ("outboxd audit").
//
// For a range of rows (ids FromID to ToID, or created_at from Since to
// Until) it reads
//
//   - the Kafka records of the rows' topics (plus Config.Topics and the
//     default topic), read_committed: each partition from its start (or from
//     the offset of FromOffsetTime) up to the high watermark noted when the
//     audit starts, after waiting (at most StableTimeout) for the partition's
//     last stable offset to pass it, so that a transaction open at the start
//     is decided rather than left out; each record is indexed by its
//     outbox-id header;
//   - then the rows, in id order, each compared with its records, all read
//     in one read-only REPEATABLE READ snapshot taken before the high
//     watermarks are noted (a row retention deletes meanwhile is still
//     checked; the snapshot holds back vacuum while the audit reads).
//
// The verdicts, per topic:
//
//   - Missing: a row with no record. Only rows older than the publisher's
//     lag can be judged: a row committed but not yet published when the high
//     watermarks were noted is reported missing (wait for the publish fence,
//     outbox_wait_published, or audit a range that is older).
//   - Duplicates: an outbox-id delivered more than once, counted separately
//     when the copies carry the same outbox-origin header (a re-send by the
//     same history: a crash, a session restart) and when they do not (a
//     replay or a rewind under another generation).
//   - Reorders: per Kafka key (the aggregate) and partition, a first
//     delivery whose id is below the id of an earlier first delivery. Ids
//     are taken as commit order within an aggregate: true when one writer at
//     a time writes an aggregate (its business row locked in the transaction
//     that inserts the outbox row), which is what per-aggregate order
//     assumes anyway; two concurrent writers of one aggregate can commit out
//     of id order and show as reorders that are not outboxd's.
//   - Mismatches: a record whose key, value or headers differ from what
//     outboxd would build from the row (outbox.NewRecord, the headers column
//     parsed as the decoder does; the outbox-origin header is left out, it
//     names the publisher, not the event), or that went to another topic.
//     Compared by a 64-bit hash, for the default record shape only
//     (--format outboxd, raw encodings, no Schema Registry format and no
//     CloudEvents): with any other, mismatch checking is off and said so.
//   - Records with no row: below the lowest id still in the table they are
//     proven delivered but cannot be checked against a row (retention
//     deleted it: Retained, not a verdict); at or above it (a deleted row, a
//     row of another database writing the same topic, ids reused after a
//     restore) their origin is unknown (Unknown, a verdict).
//
// Records without a parsable outbox-id header (other producers sharing the
// topic) are counted as foreign and otherwise ignored.
//
// # Memory
//
// No payload is held: each id of the range gets one fixed-size entry (the
// hash of its first delivery, partition, offset, delivery count, the hash of
// its origin header, its topic, flags), in one array indexed by id:
//
//	live ≈ 32 × (hi − lo + 1)             the rows' id range, lo..hi
//	     + (tableMin − FromID) / 8        one bit per id below the lowest row (by time: from id 1)
//	     + 48 × keys of one partition     the order check, cleared per partition
//	     + 2 × 16 MiB                     one fetch response and its decoded records
//	     + 8 × examples × verdicts        ids listed per verdict and topic (Config.Examples)
//	     + 16 × missing ranges            consecutive missing ids, for a repair
//	peak RSS ≈ 2 × live + 20 MiB          Go's collector (GOGC=100), runtime and binary
//
// so 1,000,000 ids cost 32 MB of entries; measured ("make bench-audit",
// 1,000,000 events of 10,000 keys on 6 partitions): 124–126 MiB peak RSS,
// 2.1–2.3 s of CPU. A range wider than MaxIDs ids is refused (narrow it,
// or raise MaxIDs).
package audit
