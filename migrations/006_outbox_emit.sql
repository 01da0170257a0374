-- The table-less outbox: outbox_emit writes an event straight into WAL as a
-- transactional logical decoding message (prefix 'outboxd'), published only
-- if the caller's transaction commits, in commit order with the table's
-- rows. Nothing is left to vacuum or delete. outboxd reads these messages
-- with pgoutput's messages option (PostgreSQL 14 or later; "outboxd run
-- --source=messages" needs no outbox table at all).
--
--   SELECT outbox_emit('orders', 'order-42', '{"status": "paid"}',
--                      jsonb_build_object('traceparent', $1::text));
--
-- The record: topic, key, the payload's jsonb text as value, the headers
-- object's members as headers, and outbox-id = the message's LSN (unique and
-- stable across replays, so consumers deduplicate as with the table).
--
-- The content format (v1) is outboxd's, read by replication.parseMessageV1:
-- 'v1:' then <bytes>:<topic> <bytes>:<key> <bytes>:<headers>, then the
-- payload. NULL key or payload is refused: pg_logical_emit_message is STRICT
-- and would otherwise emit nothing, silently. A NULL topic is sent as none
-- (--default-topic applies).
--
-- SECURITY DEFINER with a fixed search_path, and no EXECUTE for PUBLIC:
-- grant it to the roles that write events, and revoke
-- pg_logical_emit_message from PUBLIC (docs/shapes.md shows both), so that
-- nobody else can put events into the stream.
CREATE OR REPLACE FUNCTION outbox_emit(topic text, key text, payload jsonb, headers jsonb DEFAULT '{}')
RETURNS pg_lsn
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    t text := coalesce(topic, '');
    h text := coalesce(headers, '{}'::jsonb)::text;
BEGIN
    IF key IS NULL OR payload IS NULL THEN
        RAISE EXCEPTION 'outbox_emit: key and payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(coalesce(headers, '{}'::jsonb)) <> 'object' THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pg_logical_emit_message(true, 'outboxd',
        'v1:' || octet_length(t) || ':' || t
              || octet_length(key) || ':' || key
              || octet_length(h) || ':' || h
              || payload::text);
END
$fn$;

REVOKE ALL ON FUNCTION outbox_emit(text, text, jsonb, jsonb) FROM PUBLIC;
