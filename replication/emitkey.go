package replication

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// messageKeyQuery says whether outbox_emit and its key table exist on the
// search path, and whether the current role may read the key.
const messageKeyQuery = `SELECT pg_catalog.to_regprocedure('outbox_emit(text,text,jsonb,jsonb)') IS NOT NULL,
       pg_catalog.to_regclass('outbox_emit_key') IS NOT NULL,
       coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('outbox_emit_key'), 'SELECT'), false),
       current_user`

// readMessageKey decides whether this session reads outbox_emit's messages
// and with which key: only when the decoder config asks for messages, the
// server sends them (14+) and the key is installed. --source=messages
// (MessagesRequired) and an outbox_emit without its key (a database
// migrated by an older outboxd: it still writes unauthenticated messages)
// are errors wrapping ErrMessageKey.
func (s *Stream) readMessageKey(ctx context.Context) (*MessageKey, error) {
	dc := s.cfg.Decoder
	if !dc.Messages || serverMajor(s.conn.ParameterStatus("server_version")) < 14 {
		return nil, nil
	}
	rows, err := s.conn.Exec(ctx, messageKeyQuery).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("replication: look up outbox_emit and its key: %w", err)
	}
	if len(rows) == 0 || len(rows[0].Rows) == 0 {
		return nil, fmt.Errorf("replication: look up outbox_emit and its key: no row")
	}
	r := rows[0].Rows[0]
	emit, table, readable, role := string(r[0]) == "t", string(r[1]) == "t", string(r[2]) == "t", string(r[3])
	switch {
	case !table && emit:
		return nil, fmt.Errorf("%w: outbox_emit is installed without its MAC key (table outbox_emit_key, migration 007), so its messages cannot be authenticated: run \"outboxd migrate\"", ErrMessageKey)
	case !table && dc.MessagesRequired:
		return nil, fmt.Errorf("%w: --source=messages needs outbox_emit and its key (table outbox_emit_key): run \"outboxd migrate\"", ErrMessageKey)
	case !table:
		s.log.Info("outbox_emit is not installed: logical decoding messages are not read")
		return nil, nil
	case !readable:
		return nil, fmt.Errorf("%w: role %q cannot read table outbox_emit_key, so outbox_emit's messages cannot be authenticated: GRANT SELECT ON outbox_emit_key TO %q (as its owner)", ErrMessageKey, role, role)
	}
	rows, err = s.conn.Exec(ctx, `SELECT encode(key, 'hex'), installed_lsn::text FROM outbox_emit_key`).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("replication: read outbox_emit_key: %w", err)
	}
	if len(rows) == 0 || len(rows[0].Rows) != 1 {
		return nil, fmt.Errorf("%w: table outbox_emit_key holds no key: run \"outboxd migrate\" on a fresh database, or restore the row", ErrMessageKey)
	}
	r = rows[0].Rows[0]
	k := &MessageKey{}
	if k.Key, err = hex.DecodeString(string(r[0])); err != nil || len(k.Key) == 0 {
		return nil, fmt.Errorf("%w: outbox_emit_key.key is not a key", ErrMessageKey)
	}
	if k.InstalledLSN, err = pglogrepl.ParseLSN(string(r[1])); err != nil {
		return nil, fmt.Errorf("%w: outbox_emit_key.installed_lsn: %v", ErrMessageKey, err)
	}
	s.log.Debug("reading outbox_emit's messages", zap.Stringer("key_installed_lsn", k.InstalledLSN))
	return k, nil
}
