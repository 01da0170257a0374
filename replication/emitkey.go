package replication

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// messageKeyQuery says whether outbox_emit and its key table exist in the
// schema the outbox table lives in (%[1]s, a string literal: migrate
// installs all three in one schema), whether the key table has migration
// 008's columns, and whether the current role may read the key. Names are
// qualified, never looked up through search_path: a role whose path misses
// that schema would find nothing and read on without messages, and a schema
// earlier on the path could hold a key of someone else's.
const messageKeyQuery = `WITH n(emit, tbl) AS (
    SELECT pg_catalog.to_regprocedure(pg_catalog.format('%%I.outbox_emit(text,text,jsonb,jsonb)', %[1]s)),
           pg_catalog.to_regclass(pg_catalog.format('%%I.outbox_emit_key', %[1]s)))
SELECT emit IS NOT NULL,
       tbl IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = tbl AND a.attname = 'v3_installed_lsn' AND NOT a.attisdropped),
       coalesce(pg_catalog.has_table_privilege(tbl, 'SELECT'), false),
       current_user
FROM n`

// readKeyQuery reads the key row of the table %s (qualified) and the
// server's next transaction id, without taking one.
const readKeyQuery = `SELECT encode(key, 'hex'), encode(key_ipad, 'hex'), encode(key_opad, 'hex'),
       encode(next_key, 'hex'), coalesce(encode(previous_key, 'hex'), ''),
       installed_lsn::text, v3_installed_lsn::text,
       pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text
FROM %s`

// readMessageKey decides whether this session reads outbox_emit's messages
// and with which keys: only when the decoder config asks for messages, the
// server sends them (14+) and the key is installed in the outbox table's
// schema. --source=messages (MessagesRequired), an outbox_emit without its
// key or with the key of a migration before 008 (its messages can be
// replayed), and pads that do not match the key are errors wrapping
// ErrMessageKey.
func (s *Stream) readMessageKey(ctx context.Context) (*MessageKey, error) {
	dc := s.cfg.Decoder
	if !dc.Messages || serverMajor(s.conn.ParameterStatus("server_version")) < 14 {
		return nil, nil
	}
	schema := or(dc.Schema, "public")
	schemaLit, err := s.quoteLiteral(schema)
	if err != nil {
		return nil, err
	}
	rows, err := s.conn.Exec(ctx, fmt.Sprintf(messageKeyQuery, schemaLit)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("replication: look up %s.outbox_emit and its key: %w", schema, err)
	}
	if len(rows) == 0 || len(rows[0].Rows) == 0 {
		return nil, fmt.Errorf("replication: look up %s.outbox_emit and its key: no row", schema)
	}
	r := rows[0].Rows[0]
	emit, table, v3, readable, role := string(r[0]) == "t", string(r[1]) == "t", string(r[2]) == "t", string(r[3]) == "t", string(r[4])
	qtable := pgx.Identifier{schema, "outbox_emit_key"}.Sanitize()
	switch {
	case !table && emit:
		return nil, fmt.Errorf("%w: %s.outbox_emit is installed without its MAC key (table %s, migration 007), so its messages cannot be authenticated: run \"outboxd migrate\"", ErrMessageKey, schema, qtable)
	case !table && dc.MessagesRequired:
		return nil, fmt.Errorf("%w: --source=messages needs outbox_emit and its key (table %s) in --schema %q: run \"outboxd migrate\" there, or pass the --schema it used", ErrMessageKey, qtable, schema)
	case !table:
		s.log.Info("outbox_emit is not installed: logical decoding messages are not read", zap.String("schema", schema))
		return nil, nil
	case !readable:
		return nil, fmt.Errorf("%w: role %q cannot read table %s, so outbox_emit's messages cannot be authenticated: GRANT SELECT ON %s TO %s (as its owner)", ErrMessageKey, role, qtable, qtable, pgx.Identifier{role}.Sanitize())
	case !v3:
		return nil, fmt.Errorf("%w: %s is from migration 007, whose outbox_emit writes messages that anyone who has seen one can replay: run \"outboxd migrate\"", ErrMessageKey, qtable)
	}
	rows, err = s.conn.Exec(ctx, fmt.Sprintf(readKeyQuery, qtable)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("replication: read %s: %w", qtable, err)
	}
	if len(rows) == 0 || len(rows[0].Rows) != 1 {
		return nil, fmt.Errorf("%w: table %s holds no key: run \"outboxd migrate\" on a fresh database, or restore the row", ErrMessageKey, qtable)
	}
	k, err := parseKeyRow(rows[0].Rows[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMessageKey, qtable, err)
	}
	s.log.Debug("reading outbox_emit's messages", zap.String("key_table", qtable),
		zap.Stringer("key_installed_lsn", k.InstalledLSN), zap.Stringer("v3_installed_lsn", k.V2Until), zap.Uint64("next_xid", k.NextXid))
	return k, nil
}

// parseKeyRow reads a row of readKeyQuery and checks that the pads
// outbox_emit signs with are those of the key outboxd verifies with: with
// other pads every message would be rejected as bad_mac, so the session
// refuses to start instead.
func parseKeyRow(r [][]byte) (*MessageKey, error) {
	var f [5][]byte
	for i, name := range []string{"key", "key_ipad", "key_opad", "next_key", "previous_key"} {
		b, err := hex.DecodeString(string(r[i]))
		if err != nil || (len(b) == 0 && name != "previous_key") {
			return nil, fmt.Errorf("%s is not a key", name)
		}
		f[i] = b
	}
	k := &MessageKey{Key: f[0], Next: f[3], Previous: f[4]}
	if len(k.Previous) == 0 {
		k.Previous = nil
	}
	if !bytes.Equal(f[1], hmacPad(k.Key, 0x36)) || !bytes.Equal(f[2], hmacPad(k.Key, 0x5c)) {
		return nil, fmt.Errorf("key_ipad/key_opad do not match key, so outbox_emit signs with another key than the one outboxd verifies with: recreate outbox_emit_pad from migrations/009_outbox_emit_xid.sql and run SELECT outbox_emit_rotate_key()")
	}
	var err error
	if k.InstalledLSN, err = pglogrepl.ParseLSN(string(r[5])); err != nil {
		return nil, fmt.Errorf("installed_lsn: %v", err)
	}
	if k.V2Until, err = pglogrepl.ParseLSN(string(r[6])); err != nil {
		return nil, fmt.Errorf("v3_installed_lsn: %v", err)
	}
	if k.NextXid, err = strconv.ParseUint(string(r[7]), 10, 64); err != nil {
		return nil, fmt.Errorf("the server's next transaction id %q: %v", r[7], err)
	}
	return k, nil
}

// hmacPad is HMAC's inner (0x36) or outer (0x5c) pad of a key of at most
// one SHA-256 block: what outbox_emit_pad computes.
func hmacPad(key []byte, pad byte) []byte {
	b := bytes.Repeat([]byte{pad}, 64)
	for i, c := range key {
		b[i] = c ^ pad
	}
	return b
}
