package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A port chosen free can be bound by someone else before the server starts
// (end-to-end packages start private servers at the same time): the server
// moves to another port rather than fail the test.
func TestStartPostgresMovesOffAPortTakenMeanwhile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL")
	}
	s := newPGServer(t, "outboxd-pg-port-")
	if err := stack("pg-init", s.Dir, strconv.Itoa(s.Port)); err != nil {
		unavailable(t, hintPrivate, "cannot create a private PostgreSQL: %v", err)
	}
	taken := s.Port
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", taken))
	if err != nil {
		t.Fatalf("take the port: %v", err)
	}
	defer l.Close()
	s.startFirst()
	if s.Port == taken {
		t.Fatalf("the server claims port %d, which the test holds", taken)
	}
	c, err := pgx.Connect(context.Background(), s.DSN)
	if err != nil {
		t.Fatalf("connect to the moved server at %s: %v", s.DSN, err)
	}
	c.Close(context.Background())
}
