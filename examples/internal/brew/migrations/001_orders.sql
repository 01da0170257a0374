-- The orders of the example order service (examples/orderservice). An order
-- and its order.created outbox row are written in one transaction, so either
-- both exist or neither does. status is the service's own view; the consumer
-- example keeps its projection in order_status (002).
--
-- The examples' migrations are applied by brew.Migrate ("democtl migrate",
-- which the demo's db-init runs after "outboxd migrate") and recorded in
-- brew_schema_migrations. This used to be outboxd's migration 002: a
-- database migrated then has the table already, and IF NOT EXISTS keeps it.
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial     PRIMARY KEY,
    customer   text          NOT NULL,
    amount     numeric(12,2) NOT NULL CHECK (amount >= 0),
    status     text          NOT NULL DEFAULT 'created',
    created_at timestamptz   NOT NULL DEFAULT now(),
    updated_at timestamptz   NOT NULL DEFAULT now()
);
