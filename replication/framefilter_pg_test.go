package replication

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// TestStreamForeignMessageNotHeld: a role emits a 200 MB logical decoding
// message with another prefix in the middle of a transaction of
// outbox_emit events, on real PostgreSQL. Every event arrives, in order;
// the stream reports the foreign message with its size; and the process
// allocates far less than the message while reading it. Before the frame
// filter pgconn read the whole CopyData into one buffer: 200 MB of heap
// for one message from a role with no grants (900 MB took outboxd to
// 928 MiB RSS).
//
// Heap is measured as runtime.MemStats.TotalAlloc over the stream's life:
// every byte the process allocated, whatever the GC freed since, so it
// bounds the peak heap's growth from above without sampling. The test is
// not parallel, so nothing else in the process allocates meanwhile.
func TestStreamForeignMessageNotHeld(t *testing.T) {
	const size = 200_000_000
	e := newEmitDB(t)
	ctx := context.Background()
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT outbox_emit('t', 'k', '{"n": 2}')`,
		// Built by the server: the test process never holds it either.
		`SELECT pg_logical_emit_message(true, 'stranger', repeat('x', 200000000))`,
		`SELECT outbox_emit('t', 'k', '{"n": 3}')`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', 't', '{"n": 4}')`)

	var mu sync.Mutex
	var foreign []ForeignMessage
	cfg := DefaultStreamConfig()
	cfg.ConnString, cfg.Slot, cfg.Publication = e.connString, e.slot, e.pub
	cfg.StatusInterval, cfg.ConnectTimeout = 100*time.Millisecond, 30*time.Second
	cfg.Decoder.Messages = true
	cfg.OnForeignMessage = func(m ForeignMessage) {
		mu.Lock()
		defer mu.Unlock()
		foreign = append(foreign, m)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := Open(octx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ms := e.stream(s)
	for _, p := range []string{`{"n": 1}`, `{"n": 2}`, `{"n": 3}`, `{"n": 4}`} {
		wantEvent(t, ms, p)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d MiB while streaming a %d MB foreign message (heap in use %d MiB, from the OS %d MiB)",
		alloc>>20, size/1_000_000, after.HeapInuse>>20, after.Sys>>20)
	if alloc > size/4 {
		t.Errorf("allocated %d MiB while streaming, want well below the foreign message's %d MB: its content was held", alloc>>20, size/1_000_000)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(foreign) != 1 || foreign[0].Prefix != "stranger" || foreign[0].Size != size || !foreign[0].Transactional {
		t.Errorf("foreign messages reported: %+v, want the one of prefix stranger and %d bytes", foreign, size)
	}
}

// TestStreamOwnMessageTooLargeNotHeld: on real PostgreSQL, a role with no
// grants emits a 100 MB message with outboxd's prefix shaped like
// outbox_emit's, and outbox_emit writes an event of 100 MB between small
// ones, with the stream's max message bytes at 1 MB. The forged one is
// rejected as bad_mac, the authentic one is a bad event naming its size,
// with its topic and key and no payload, the small events arrive in order,
// and the process allocates far less than the messages while reading them:
// the key reaches the frame filter before the stream starts. Before, both
// were read whole to check their MAC.
func TestStreamOwnMessageTooLargeNotHeld(t *testing.T) {
	const size = 100_000_000
	e := newEmitDB(t)
	ctx := context.Background()
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	role := testenv.UniqueName("stranger")
	e.exec(`CREATE ROLE ` + pgx.Identifier{role}.Sanitize())
	t.Cleanup(func() { _, _ = e.conn.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize()) })
	err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			return err
		}
		// Built by the server: the test process never holds it either.
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', 'v3:' || repeat('0', 64) || ':1:' || repeat('x', $1))`, size)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SELECT outbox_emit('t', 'k', '{"n": 2}')`,
			`SELECT outbox_emit('big-topic', 'big-key', jsonb_build_object('pad', repeat('y', 100000000)))`,
			`SELECT outbox_emit('t', 'k', '{"n": 3}')`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 4}')`)

	cfg := DefaultStreamConfig()
	cfg.ConnString, cfg.Slot, cfg.Publication = e.connString, e.slot, e.pub
	cfg.StatusInterval, cfg.ConnectTimeout = 100*time.Millisecond, 30*time.Second
	cfg.Decoder.Messages = true
	cfg.MaxMessageBytes = 1_000_000
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := Open(octx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ms := e.stream(s)
	wantEvent(t, ms, `{"n": 1}`)
	if m := next(t, ms); m.Kind != KindRejected || m.Rejected.Reason != RejectBadMAC {
		t.Fatalf("the forged message: %v %+v, want rejected as bad_mac", m.Kind, m.Rejected)
	}
	wantEvent(t, ms, `{"n": 2}`)
	m := next(t, ms)
	if m.Kind != KindBad || !strings.Contains(m.Bad.Reason, "larger than --kafka-max-message-bytes (1000000)") {
		t.Fatalf("the authentic message: %v %+v %+v, want a bad event naming its size", m.Kind, m.Rejected, m.Bad)
	}
	want := []ColumnText{{Name: "topic", Value: []byte("big-topic")}, {Name: "key", Value: []byte("big-key")}}
	if !reflect.DeepEqual(m.Bad.Columns, want) {
		t.Errorf("bad event columns %+v, want its topic and key only", m.Bad.Columns)
	}
	wantEvent(t, ms, `{"n": 3}`)
	wantEvent(t, ms, `{"n": 4}`)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d MiB while streaming two own-prefix messages of %d MB (heap in use %d MiB)", alloc>>20, size/1_000_000, after.HeapInuse>>20)
	if alloc > size/4 {
		t.Errorf("allocated %d MiB while streaming, want well below the messages' %d MB: a content was held", alloc>>20, size/1_000_000)
	}
}

// TestStreamForeignMessageDroppedOverTLS: with the replication connection
// encrypted, the frame filter still reads the protocol (pgconn hands it
// the stream after TLS), so a foreign message is dropped there too and
// the events around it arrive. A filter under TLS would see ciphertext and
// pass it all on: nothing dropped, nothing reported.
func TestStreamForeignMessageDroppedOverTLS(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgres(t)
	dataDir := filepath.Join(srv.Dir, "data")
	writeSelfSignedCert(t, filepath.Join(dataDir, "server.crt"), filepath.Join(dataDir, "server.key"))
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET ssl = on`)
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A restart rather than a reload: pg_reload_conf only signals, and
	// the next connection may come before the postmaster has read it.
	srv.Restart("fast")
	tlsDSN := strings.Replace(srv.DSN, "sslmode=disable", "sslmode=require", 1)
	conn, err := pgx.Connect(ctx, tlsDSN)
	if err != nil {
		t.Fatalf("connect with sslmode=require after turning ssl on: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		t.Fatal(err)
	}
	e := &emitDB{t: t, conn: conn, slot: "tls", pub: "outboxd", connString: tlsDSN}
	e.exec(`CREATE PUBLICATION outboxd FOR TABLE outbox`)
	e.exec(`SELECT pg_create_logical_replication_slot('tls', 'pgoutput')`)
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 1}')`)
	e.exec(`SELECT pg_logical_emit_message(true, 'stranger', repeat('x', 5000000))`)
	e.exec(`SELECT outbox_emit('t', 'k', '{"n": 2}')`)

	foreign := make(chan ForeignMessage, 4)
	cfg := DefaultStreamConfig()
	cfg.ConnString, cfg.Slot, cfg.Publication = tlsDSN, e.slot, e.pub
	cfg.StatusInterval, cfg.ConnectTimeout = 100*time.Millisecond, 30*time.Second
	cfg.Decoder.Messages = true
	cfg.OnForeignMessage = func(m ForeignMessage) { foreign <- m }
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := Open(octx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	var encrypted bool
	if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = $1`, s.BackendPID()).Scan(&encrypted); err != nil || !encrypted {
		t.Fatalf("the replication connection is not encrypted (ssl %v, %v): the test would prove nothing", encrypted, err)
	}
	ms := e.stream(s)
	wantEvent(t, ms, `{"n": 1}`)
	wantEvent(t, ms, `{"n": 2}`)
	select {
	case m := <-foreign:
		if m.Prefix != "stranger" || m.Size != 5000000 {
			t.Fatalf("reported %+v, want prefix stranger of 5000000 bytes", m)
		}
	default:
		t.Fatal("the foreign message between the two events was not dropped")
	}
}

// writeSelfSignedCert writes a server certificate and key PostgreSQL
// accepts: owned by the data directory's owner (the server does not run as
// root), the key readable by it only.
func writeSelfSignedCert(t *testing.T, certFile, keyFile string) {
	t.Helper()
	dir, err := os.Stat(filepath.Dir(certFile))
	if err != nil {
		t.Fatal(err)
	}
	owner, ok := dir.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no file owners on this system")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chown(f, int(owner.Uid), int(owner.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}
