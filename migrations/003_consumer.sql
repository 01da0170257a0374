-- Consumer side (package consumer and examples/statusconsumer).
--
-- processed_outbox_ids is the deduplication table of package consumer: the
-- consumer inserts the event's outbox id (ON CONFLICT DO NOTHING) in the same
-- transaction as the handler's writes, so "seen" and "done" commit together.
-- A redelivered event finds its id and is skipped; duplicates counts those
-- skipped redeliveries. Events sent to a dead-letter topic are not recorded,
-- so they can be replayed once fixed.
CREATE TABLE IF NOT EXISTS processed_outbox_ids (
    outbox_id    bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    duplicates   integer     NOT NULL DEFAULT 0
);

-- order_status is the projection kept by examples/statusconsumer: one row per
-- order, moved along the order state machine by order.status_changed events.
-- events counts the events applied to the row, so a doubled effect shows.
CREATE TABLE IF NOT EXISTS order_status (
    order_id       bigint        PRIMARY KEY,
    customer       text          NOT NULL,
    amount         numeric(12,2) NOT NULL,
    status         text          NOT NULL,
    events         integer       NOT NULL DEFAULT 1,
    last_outbox_id bigint        NOT NULL,
    updated_at     timestamptz   NOT NULL DEFAULT now()
);
