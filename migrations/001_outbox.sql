-- The outbox table: one row per event, written by the application in the same
-- transaction as its business change. outboxd publishes each inserted row to
-- Kafka (key aggregate_id, topic from the row) through a pgoutput replication
-- slot; the publication is created by the slot package, because its name is
-- configurable.
CREATE TABLE IF NOT EXISTS outbox (
    id           bigserial   PRIMARY KEY,
    aggregate_id text        NOT NULL,
    topic        text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
