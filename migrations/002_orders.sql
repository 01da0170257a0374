-- The orders of the example order service (examples/orderservice). An order
-- and its order.created outbox row are written in one transaction, so either
-- both exist or neither does. status is the service's own view; the consumer
-- example keeps its projection in order_status (003).
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial     PRIMARY KEY,
    customer   text          NOT NULL,
    amount     numeric(12,2) NOT NULL CHECK (amount >= 0),
    status     text          NOT NULL DEFAULT 'created',
    created_at timestamptz   NOT NULL DEFAULT now(),
    updated_at timestamptz   NOT NULL DEFAULT now()
);
