-- How testdata/pg15_*.txt were captured (PostgreSQL 15.18, wal_level=logical):
-- run this file, then for each TimeZone in UTC, Asia/Kolkata, America/Sao_Paulo:
--   SET TimeZone='...'; SET DateStyle='ISO';
--   SELECT lsn, xid, encode(data,'hex') FROM pg_logical_slot_peek_binary_changes('cap', NULL, NULL,
--     'proto_version', '1', 'publication_names', 'pub', 'messages', 'true');

SET TimeZone='UTC'; SET DateStyle='ISO';
CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, topic text, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), event_type text);
CREATE TABLE orders (id int PRIMARY KEY, note text);
CREATE TYPE mood AS ENUM ('ok','sad');
CREATE TABLE moods (id int PRIMARY KEY, m mood);
CREATE SCHEMA bin;
CREATE TABLE bin.outbox (payload bytea NOT NULL, aggregate_id varchar(64) NOT NULL, id int NOT NULL, created_at timestamp NOT NULL);
CREATE PUBLICATION pub FOR ALL TABLES;
SELECT pg_create_logical_replication_slot('cap', 'pgoutput');

BEGIN;
INSERT INTO outbox (aggregate_id, topic, payload, created_at, event_type) VALUES ('order-1', 'orders', '{"b": 2, "a": [1, "x"]}', '2026-11-29 09:21:44.123456+00', 'OrderCreated');
INSERT INTO outbox (aggregate_id, topic, payload, created_at) VALUES ('order-2', NULL, '{"note": "caf\u00e9 \"quoted\""}', '2026-11-29 15:00:00+05:30');
INSERT INTO orders VALUES (1, 'first');
COMMIT;
UPDATE orders SET note = 'second' WHERE id = 1;
DELETE FROM orders WHERE id = 1;
TRUNCATE orders;
INSERT INTO moods VALUES (1, 'ok');
SELECT pg_logical_emit_message(true, 'outboxd', 'hello');
SELECT pg_logical_emit_message(false, 'outboxd', 'nontx');
ALTER TABLE outbox ADD COLUMN trace_id text;
INSERT INTO outbox (aggregate_id, topic, payload, trace_id) VALUES ('order-3', 'orders', '[]', 'abc');
INSERT INTO bin.outbox VALUES ('\x000102fffe0a', 'agg-bin', 7, '2026-11-29 09:21:44');
SELECT pg_replication_origin_create('upstream');
SELECT pg_replication_origin_session_setup('upstream');
BEGIN;
SELECT pg_replication_origin_xact_setup('0/12345678', now());
INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('order-4', 'orders', '{}');
COMMIT;
