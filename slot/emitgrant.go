package slot

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// publicEmitQuery lists the signatures of pg_logical_emit_message that
// PUBLIC may execute: a NULL proacl is the default, EXECUTE for PUBLIC;
// otherwise an aclexplode entry with grantee 0 (PUBLIC).
// has_function_privilege cannot answer for PUBLIC, which is no role.
const publicEmitQuery = `SELECT p.oid::regprocedure::text
FROM pg_catalog.pg_proc p
WHERE p.proname = 'pg_logical_emit_message'
  AND p.pronamespace = 'pg_catalog'::regnamespace
  AND (p.proacl IS NULL OR EXISTS (
        SELECT 1 FROM pg_catalog.aclexplode(p.proacl) a
        WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
ORDER BY 1`

// PublicEmitters returns the signatures of pg_logical_emit_message that
// PUBLIC can still execute: empty when it was revoked.
func PublicEmitters(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, publicEmitQuery)
	if err != nil {
		return nil, fmt.Errorf("slot: read the privileges of pg_logical_emit_message: %w", err)
	}
	sigs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("slot: read the privileges of pg_logical_emit_message: %w", err)
	}
	return sigs, nil
}

// EmitWarning is the one-line warning for PUBLIC still executing the
// signatures sigs of pg_logical_emit_message; "" when sigs is empty.
func EmitWarning(sigs []string) string {
	if len(sigs) == 0 {
		return ""
	}
	var revokes []string
	for _, s := range sigs {
		revokes = append(revokes, "REVOKE EXECUTE ON FUNCTION "+s+" FROM PUBLIC;")
	}
	return "PUBLIC can execute pg_logical_emit_message: any role can write WAL messages with outboxd's prefix (outboxd skips them unless outbox_emit signed them, but they cost WAL and log lines); as a superuser run: " +
		strings.Join(revokes, " ")
}

// RevokePublicEmit revokes EXECUTE on pg_logical_emit_message from PUBLIC
// (every signature) and returns the signatures PUBLIC can still execute
// afterwards: all of them when the current role may not revoke (only a
// superuser may: the functions belong to the bootstrap superuser; PostgreSQL
// then only warns). Roles that need the function afterwards (other tools'
// heartbeats, say) need an explicit GRANT.
func RevokePublicEmit(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	sigs, err := PublicEmitters(ctx, conn)
	if err != nil || len(sigs) == 0 {
		return sigs, err
	}
	for _, s := range sigs {
		// s is regprocedure's output, already quoted where needed.
		_, err := conn.Exec(ctx, "REVOKE EXECUTE ON FUNCTION "+s+" FROM PUBLIC")
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			break
		}
		if err != nil {
			return nil, fmt.Errorf("slot: revoke %s from PUBLIC: %w", s, err)
		}
	}
	return PublicEmitters(ctx, conn)
}
