-- outbox_emit refuses headers outboxd cannot publish, so that the writer's
-- transaction fails instead of committing an event outboxd would have to
-- dead-letter (or halt on). The rule is the one outboxd decodes both the
-- outbox table's headers column and these messages by (docs/shapes.md,
-- "Headers"):
--
-- - a member whose value is a string is a header;
-- - a member whose value is JSON null is no header (the natural meaning of
--   jsonb_build_object('traceparent', NULL::text) for an optional trace
--   header): accepted here, and dropped by outboxd;
-- - any other value (number, boolean, object, array) is refused, naming the
--   header;
-- - a name outboxd sets itself is refused with a string value, naming the
--   header: outbox-id, aggregate-id, event-type, outbox-origin,
--   content-type, and every name starting with ce_ (CloudEvents), dlq- or
--   outboxd- (dead-letter records). The list is outbox.ReservedHeader's
--   (outbox/headers.go): change both together. Names only a configuration
--   reserves (another --id-header or --key-header, a --header-column's
--   header) are not known here: outboxd makes such an event a bad event.
--
-- The check is its own function so that outbox_emit changes by one line
-- (PERFORM) and keeps its signature and MAC computation exactly as
-- migration 007 wrote them. It is not SECURITY DEFINER and reads nothing;
-- outbox_emit calls it as its owner, so PUBLIC needs no EXECUTE.
CREATE OR REPLACE FUNCTION outbox_emit_check_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    m record;
BEGIN
    IF headers IS NULL OR jsonb_typeof(headers) = 'null' THEN
        RETURN;
    END IF;
    IF jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR m IN SELECT key, value FROM jsonb_each(headers) LOOP
        CONTINUE WHEN jsonb_typeof(m.value) = 'null';
        IF jsonb_typeof(m.value) <> 'string' THEN
            RAISE EXCEPTION 'outbox_emit: header "%" is a JSON %: a header value must be a string (or null: no header)',
                m.key, jsonb_typeof(m.value)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF m.key IN ('outbox-id', 'aggregate-id', 'event-type', 'outbox-origin', 'content-type')
           OR left(m.key, 3) = 'ce_' OR left(m.key, 4) = 'dlq-' OR left(m.key, 8) = 'outboxd-' THEN
            RAISE EXCEPTION 'outbox_emit: header "%" is one outboxd sets itself: rename it', m.key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION outbox_emit_check_headers(jsonb) FROM PUBLIC;

-- outbox_emit as migration 007 wrote it, with the check added after its
-- own argument checks. Both functions are named with their schema: they
-- run with a fixed search_path that holds no user schema.
DO $do$
BEGIN
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
    PERFORM %I.outbox_emit_check_headers(headers);
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
$fn$, current_schema(), current_schema());
END
$do$;

REVOKE ALL ON FUNCTION outbox_emit(text, text, jsonb, jsonb) FROM PUBLIC;
