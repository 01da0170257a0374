-- The polling publisher (outboxd run --source=poll) marks each row it has
-- published; change data capture ignores this column.
--
-- published_at is NULL until a poller has seen Kafka acknowledge the row.
-- Adding a nullable column without a default rewrites nothing.
--
-- The partial index holds only unpublished rows, so a poll
-- (WHERE published_at IS NULL ORDER BY id LIMIT n) reads a few index entries
-- instead of scanning the table. Under CDC nothing sets published_at, so the
-- index then covers every row: one more index entry per INSERT. CREATE INDEX
-- (not CONCURRENTLY: migrations run in a transaction) blocks writes to the
-- table while it builds; on a large outbox, create it beforehand with
-- CREATE INDEX CONCURRENTLY under the same name.
--
-- Rows already in the table stay unpublished for the poller: when switching
-- a CDC deployment to polling, first mark what CDC already published, e.g.
-- UPDATE outbox SET published_at = now() WHERE id <= <last id in Kafka>.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS published_at timestamptz;
CREATE INDEX IF NOT EXISTS outbox_unpublished_id_idx ON outbox (id) WHERE published_at IS NULL;
