-- order_status is the projection kept by examples/statusconsumer: one row per
-- order, moved along the order state machine by order.status_changed events.
-- events counts the events applied to the row, so a doubled effect shows.
--
-- The consumer's deduplication table (processed_outbox_ids) is not here: it
-- ships with package consumer (consumer.Migrate), which brew.Migrate calls.
-- Both tables used to be outboxd's migration 003.
CREATE TABLE IF NOT EXISTS order_status (
    order_id       bigint        PRIMARY KEY,
    customer       text          NOT NULL,
    amount         numeric(12,2) NOT NULL,
    status         text          NOT NULL,
    events         integer       NOT NULL DEFAULT 1,
    last_outbox_id bigint        NOT NULL,
    updated_at     timestamptz   NOT NULL DEFAULT now()
);
