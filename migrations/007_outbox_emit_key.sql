-- Authenticated outbox messages. pg_logical_emit_message is executable by
-- PUBLIC by default, and pgoutput tells outboxd nothing about who emitted a
-- message: without proof, any role that can log in could forge events (or,
-- before outboxd skipped bad content, halt it). From this migration on,
-- outbox_emit signs what it writes with HMAC-SHA256 under a random key that
-- only this table's owner (the role running "outboxd migrate", which owns
-- outbox_emit) and the roles it grants SELECT to (outboxd's) can read.
-- outboxd reads the key when a session starts and publishes a message with
-- prefix 'outboxd' only when its MAC verifies; anything else is counted,
-- logged and skipped.
--
-- Format v2: 'v2:' <64 hex digits of the MAC> ':' then v1's fields
-- (<bytes>:<topic> <bytes>:<key> <bytes>:<headers>, then the payload); the
-- MAC is HMAC-SHA256(key, 'v2:' || fields), over the content's bytes in
-- the database encoding (the bytes pgoutput sends).
--
-- HMAC is built from core sha256() (PostgreSQL 11+): pgcrypto's hmac()
-- would need CREATE EXTENSION and is not in every server build. The key's
-- inner and outer pads are kept beside it so that outbox_emit does two
-- sha256() calls and no loop.
--
-- installed_lsn is the WAL position when the key was installed: an
-- unauthenticated v1 message below it was written by the old outbox_emit
-- before this upgrade (the backlog a stopped outboxd had not read yet) and
-- is still published; above it only v2 is. outboxd's role needs SELECT on
-- this table (deploy/least-privilege.sql grants it).
CREATE TABLE outbox_emit_key (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key           bytea NOT NULL CHECK (octet_length(key) = 32),
    ipad          bytea NOT NULL,
    opad          bytea NOT NULL,
    installed_lsn pg_lsn NOT NULL
);
REVOKE ALL ON TABLE outbox_emit_key FROM PUBLIC;

DO $do$
DECLARE
    -- 2 × 122 random bits from pg_strong_random (gen_random_uuid, core
    -- since PostgreSQL 13).
    k bytea := uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
    ip bytea := decode(repeat('36', 64), 'hex');
    op bytea := decode(repeat('5c', 64), 'hex');
BEGIN
    FOR i IN 0..31 LOOP
        ip := set_byte(ip, i, get_byte(k, i) # 54);  -- 0x36
        op := set_byte(op, i, get_byte(k, i) # 92);  -- 0x5c
    END LOOP;
    INSERT INTO outbox_emit_key (key, ipad, opad, installed_lsn)
    VALUES (k, ip, op, pg_current_wal_insert_lsn());

    -- The table is named with its schema: outbox_emit runs with a fixed
    -- search_path that holds no user schema.
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION outbox_emit(topic text, key text, payload jsonb, headers jsonb DEFAULT '{}')
RETURNS pg_lsn
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    t text := coalesce(topic, '');
    h text := coalesce(headers, '{}'::jsonb)::text;
    fields text;
    kr record;
BEGIN
    IF key IS NULL OR payload IS NULL THEN
        RAISE EXCEPTION 'outbox_emit: key and payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(coalesce(headers, '{}'::jsonb)) <> 'object' THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT ipad, opad INTO STRICT kr FROM %I.outbox_emit_key;
    fields := octet_length(t) || ':' || t
           || octet_length(key) || ':' || key
           || octet_length(h) || ':' || h
           || payload::text;
    RETURN pg_logical_emit_message(true, 'outboxd',
        'v2:' || encode(sha256(kr.opad || sha256(kr.ipad
                 || convert_to('v2:' || fields, getdatabaseencoding()))), 'hex')
              || ':' || fields);
END
$body$;
$fn$, current_schema());
END
$do$;

REVOKE ALL ON FUNCTION outbox_emit(text, text, jsonb, jsonb) FROM PUBLIC;
