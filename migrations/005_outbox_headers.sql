-- Per-event headers: a JSON object of string values, each member sent as a
-- Kafka header after outboxd's own (outbox-id, aggregate-id, event-type).
-- Pass a W3C trace context through it, e.g.
--   INSERT INTO outbox (aggregate_id, topic, payload, headers)
--   VALUES ($1, $2, $3, jsonb_build_object('traceparent', $4::text));
-- Nullable and without a default: adding it rewrites nothing, and a NULL
-- sends no extra header.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS headers jsonb;
