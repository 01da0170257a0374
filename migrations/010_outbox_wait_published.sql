-- The publish fence: outbox_wait_published(lsn, timeout) waits until
-- outboxd has confirmed the replication slot past lsn, and says whether it
-- did within timeout. A writer that must not go on before its events are
-- in Kafka (a test, a migration that reads the topic, a saga step) calls it
-- after its transaction committed, with a position read after the commit:
--
--   COMMIT;
--   SELECT outbox_wait_published(pg_current_wal_lsn(), '5 seconds');
--
-- What true means depends on outboxd's delivery mode, because outboxd
-- confirms a position (the slot's confirmed_flush_lsn) only once it holds:
--   at-least-once  every event committed before lsn was acknowledged by
--                  Kafka (acks=all) and the checkpoint holds it;
--   exactly-once   the Kafka transactions holding them are committed, so
--                  read_committed consumers can read them.
-- false means not yet, never "lost": outboxd stopped, stalled or slower
-- than the timeout (an outboxd that is down answers false at the timeout;
-- its events are published when it runs again). When nothing is in flight
-- outboxd confirms the server's WAL end, so a position past the last
-- outbox write is reached too. Called inside the transaction that wrote
-- the events it can only time out: they are not committed yet.
--
-- It polls pg_replication_slots (shared memory, no snapshot: a new value
-- is seen at once) every 10 ms, then up to every 100 ms. The slot is
-- outboxd's default one unless named; a slot that does not exist is an
-- error, not a false: waiting for it would only ever time out.
CREATE OR REPLACE FUNCTION outbox_wait_published(lsn pg_lsn, timeout interval, slot name DEFAULT 'outboxd')
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    deadline timestamptz := clock_timestamp() + timeout;
    confirmed pg_lsn;
    pause double precision := 0.01;
BEGIN
    IF lsn IS NULL OR timeout IS NULL THEN
        RAISE EXCEPTION 'outbox_wait_published: lsn and timeout must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    LOOP
        SELECT s.confirmed_flush_lsn INTO confirmed
          FROM pg_replication_slots s WHERE s.slot_name = slot;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'outbox_wait_published: no replication slot named "%"', slot
                USING ERRCODE = 'undefined_object',
                      HINT = 'Pass the slot outboxd runs with (--slot) as the third argument.';
        END IF;
        IF confirmed >= lsn THEN
            RETURN true;
        END IF;
        IF clock_timestamp() >= deadline THEN
            RETURN false;
        END IF;
        PERFORM pg_sleep(least(pause, greatest(extract(epoch FROM deadline - clock_timestamp()), 0)));
        pause := least(pause * 2, 0.1);
    END LOOP;
END
$fn$;
