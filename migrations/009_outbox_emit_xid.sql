-- Messages bound to the transaction that wrote them, and a key that can be
-- rotated without stopping anything.
--
-- A v2 message's MAC covers its content only. Whoever has seen one (a WAL
-- archive, a base backup, a slot peek) can emit the same content again
-- with pg_logical_emit_message, which PUBLIC may execute on managed servers,
-- and outboxd would publish it a second time under a new outbox-id. From
-- here on outbox_emit writes format v3:
--
--   'v3:' <64 hex digits of the MAC> ':' <xid> ':' then v2's fields
--
-- where <xid> is pg_current_xact_id() in decimal (the full 64-bit id of the
-- top-level transaction, the same inside a savepoint) and the MAC is
-- HMAC-SHA256(key, 'v3:' || <xid> || ':' || fields). outboxd publishes a v3
-- message only inside the transaction whose xid (pgoutput's Begin, 32 bits)
-- is the low 32 bits of <xid>, and only when <xid> is not a whole epoch
-- older than the server's: the same content in another transaction is
-- rejected as replayed.
--
-- v3_installed_lsn is the WAL position once no v2 writer is left: a v2
-- message below it is the old function's backlog and is still published,
-- at or above it v2 is rejected. The ACCESS EXCLUSIVE lock waits for every
-- transaction that has read the key (each v2 outbox_emit call holds
-- ACCESS SHARE on this table until its transaction ends), so none of them
-- can write v2 above the position; a call that starts while the lock is
-- held waits, then fails on the dropped ipad column (its transaction rolls
-- back, so its event is refused loudly instead of being rejected quietly
-- later).
--
-- outbox_emit keeps migration 008's check of its headers (it refuses what
-- outboxd could not publish).
--
-- The pads are now generated columns (key_ipad, key_opad), so rotating the
-- key can never leave them stale. Rotation is outbox_emit_rotate_key():
-- next_key, staged by the previous rotation (or here) and read by every
-- outboxd session since, becomes the signing key; the old one stays as
-- previous_key for messages signed by transactions that read it before the
-- rotation committed. A running outboxd thus verifies the first rotation
-- after it started without a restart (a second one needs a new session
-- first: restart outboxd between two rotations). The function belongs to
-- the role running migrate and is not granted to anyone.
LOCK TABLE outbox_emit_key IN ACCESS EXCLUSIVE MODE;

-- The HMAC pad of a key of at most 64 bytes: each byte XOR pad, then pad
-- up to SHA-256's block of 64 bytes.
CREATE OR REPLACE FUNCTION outbox_emit_pad(k bytea, pad integer)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT coalesce(string_agg(set_byte('\x00'::bytea, 0, get_byte(k, i) # pad), '' ORDER BY i), '')
           || decode(repeat(lpad(to_hex(pad), 2, '0'), 64 - octet_length(k)), 'hex')
    FROM generate_series(0, octet_length(k) - 1) AS i
$fn$;
REVOKE ALL ON FUNCTION outbox_emit_pad(bytea, integer) FROM PUBLIC;

ALTER TABLE outbox_emit_key
    DROP COLUMN ipad,
    DROP COLUMN opad,
    ADD COLUMN key_ipad bytea GENERATED ALWAYS AS (outbox_emit_pad(key, 54)) STORED,  -- 0x36
    ADD COLUMN key_opad bytea GENERATED ALWAYS AS (outbox_emit_pad(key, 92)) STORED,  -- 0x5c
    ADD COLUMN next_key bytea CHECK (octet_length(next_key) = 32),
    ADD COLUMN previous_key bytea CHECK (octet_length(previous_key) = 32),
    ADD COLUMN v3_installed_lsn pg_lsn;

UPDATE outbox_emit_key
SET next_key = uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
    v3_installed_lsn = pg_current_wal_insert_lsn();

ALTER TABLE outbox_emit_key
    ALTER COLUMN next_key SET NOT NULL,
    ALTER COLUMN v3_installed_lsn SET NOT NULL;

DO $do$
BEGIN
    -- Everything is named with its schema: the functions run with a fixed
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
    signed text;
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
    PERFORM %1$I.outbox_emit_check_headers(headers);
    SELECT key_ipad, key_opad INTO STRICT kr FROM %1$I.outbox_emit_key;
    fields := octet_length(t) || ':' || t
           || octet_length(key) || ':' || key
           || octet_length(h) || ':' || h
           || payload::text;
    signed := pg_current_xact_id()::text || ':' || fields;
    RETURN pg_logical_emit_message(true, 'outboxd',
        'v3:' || encode(sha256(kr.key_opad || sha256(kr.key_ipad
                 || convert_to('v3:' || signed, getdatabaseencoding()))), 'hex')
              || ':' || signed);
END
$body$;

CREATE OR REPLACE FUNCTION outbox_emit_rotate_key(forget_old_keys boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
BEGIN
    IF forget_old_keys THEN
        -- After the keys leaked (a backup, a dump or WAL holding this
        -- table): two fresh keys and no previous one. outboxd sessions that
        -- started before know neither, so pause the writers, let outboxd
        -- drain and restart it around this call. Also installs a key in a
        -- table restored without its row.
        INSERT INTO %1$I.outbox_emit_key (key, next_key, installed_lsn, v3_installed_lsn)
        VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                pg_current_wal_insert_lsn(), pg_current_wal_insert_lsn())
        ON CONFLICT (only_row) DO UPDATE
        SET key = EXCLUDED.key, next_key = EXCLUDED.next_key, previous_key = NULL;
        RETURN;
    END IF;
    UPDATE %1$I.outbox_emit_key
    SET previous_key = key,
        key = next_key,
        next_key = uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_emit_rotate_key: outbox_emit_key holds no key: call outbox_emit_rotate_key(true)';
    END IF;
END
$body$;
$fn$, current_schema());
END
$do$;

REVOKE ALL ON FUNCTION outbox_emit(text, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_emit_rotate_key(boolean) FROM PUBLIC;
