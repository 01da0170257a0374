package security

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// withPassword puts a password into a postgres:// DSN. The dev stack trusts
// loopback, so the server ignores it: it is there to be kept secret.
func withPassword(t *testing.T, dsn, password string) string {
	t.Helper()
	const p = "postgres://postgres@"
	if !strings.HasPrefix(dsn, p) {
		t.Fatalf("unexpected DSN form %s", dsn)
	}
	return "postgres://postgres:" + password + "@" + strings.TrimPrefix(dsn, p)
}

// noSecrets fails the test if any secret occurs in out.
func noSecrets(t *testing.T, what, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s contains a secret (%d chars): %s", what, len(s), out)
		}
	}
}

func TestRunKafkaSASL(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafkaSASL(t)
	pgSecret := "pg-" + testenv.UniqueName("secret")

	tlsArgs := []string{"--kafka-tls-ca-file", ks.CAFile, "--kafka-tls-cert-file", ks.ClientCertFile,
		"--kafka-tls-key-file", ks.ClientKeyFile, "--kafka-tls-server-name", "localhost"}
	for _, c := range []struct {
		name, mech string
		brokers    []string
		extra      []string
	}{
		{"SCRAM-SHA-512", "SCRAM-SHA-512", ks.SASLBrokers, nil},
		{"SCRAM-SHA-256", "SCRAM-SHA-256", ks.SASLBrokers, nil},
		{"PLAIN", "PLAIN", ks.SASLBrokers, nil},
		{"SCRAM-SHA-512 over mutual TLS", "SCRAM-SHA-512", ks.TLSBrokers, tlsArgs},
	} {
		mech := c.mech
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t)
			e := &e2e.Env{T: t, DSN: withPassword(t, pg.DSN, pgSecret), Brokers: c.brokers,
				Topic: testenv.UniqueName("sasl"), Slot: testenv.UniqueName("slot")}
			e2e.CreateTopic(t, ks.Brokers, e.Topic, 1) // over the PLAINTEXT listener
			e.Migrate()

			// The password from a file (mode 0600), the DSN secret on the
			// command line: debug logging, /metrics, config check: no secret.
			pwFile := filepath.Join(t.TempDir(), "kafka-password")
			if err := os.WriteFile(pwFile, []byte(ks.Password+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			sasl := []string{"--kafka-sasl-mechanism", mech, "--kafka-sasl-username", ks.User,
				"--kafka-sasl-password-file", pwFile, "--log-level", "debug"}
			d, base := e.StartWithMetrics(append(sasl, c.extra...)...)
			d.WaitLog("streaming", 60*time.Second)
			if err := e.Write(context.Background(), e2e.Load{Writers: 1, Aggregates: 10, Total: 200, MaxTxn: 10}); err != nil {
				t.Fatal(err)
			}
			want := e.Rows()
			v := e2e.Verify(t, want, e2e.Consume(t, ks.Brokers, e.Topic, want, time.Minute))
			if v != (e2e.Verdict{}) {
				t.Fatalf("over SASL %s: %s", mech, v)
			}
			_, metrics := e2e.Get(t, base+"/metrics")
			d.Stop()
			t.Logf("%s: %d events published, %d lines of debug output", c.name, len(want), strings.Count(d.Out.String(), "\n"))
			noSecrets(t, "outboxd output", d.Out.String(), ks.Password, pgSecret)
			noSecrets(t, "/metrics", metrics, ks.Password, pgSecret)

			// The password from the environment, through config check.
			code, out := runEnv(t, []string{"OUTBOXD_KAFKA_SASL_PASSWORD=" + ks.Password},
				append(append([]string{"config", "check", "--pg-dsn", e.DSN, "--kafka-brokers", c.brokers[0]}, sasl[:4]...), c.extra...)...)
			if code != 0 || !strings.Contains(out, "kafka-sasl-password: REDACTED # env OUTBOXD_KAFKA_SASL_PASSWORD") ||
				!strings.Contains(out, "postgres:REDACTED@") {
				t.Fatalf("config check: exit %d\n%s", code, out)
			}
			noSecrets(t, "config check", out, ks.Password, pgSecret)
		})
	}

	t.Run("TLS failures", func(t *testing.T) {
		t.Parallel()
		pg := testenv.Postgres(t)
		e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.TLSBrokers, Slot: testenv.UniqueName("slot")}
		e.Migrate()
		pw := []string{"OUTBOXD_KAFKA_SASL_PASSWORD=" + ks.Password}
		sasl := []string{"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", ks.User}
		for _, c := range []struct {
			name string
			args []string
			want string
		}{
			{"unknown CA", []string{"--kafka-tls-ca-file", ks.ClientCertFile, "--kafka-tls-cert-file", ks.ClientCertFile, "--kafka-tls-key-file", ks.ClientKeyFile},
				"outboxd: Kafka: TLS verification of the broker failed (check --kafka-tls-ca-file and --kafka-tls-server-name): kafka: client has run out of available brokers to talk to: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
			{"wrong server name", append(slices.Clone(tlsArgs[:6]), "--kafka-tls-server-name", "kafka.example.com"),
				"outboxd: Kafka: TLS verification of the broker failed (check --kafka-tls-ca-file and --kafka-tls-server-name): kafka: client has run out of available brokers to talk to: tls: failed to verify certificate: x509: certificate is valid for localhost, not kafka.example.com"},
			{"no client certificate", []string{"--kafka-tls-ca-file", ks.CAFile},
				"outboxd: Kafka: the broker refused the TLS handshake (does it require a client certificate? check --kafka-tls-cert-file and --kafka-tls-key-file): kafka: client has run out of available brokers to talk to: remote error: tls: bad certificate"},
		} {
			code, out := runEnv(t, pw, e.Args(append(sasl, c.args...)...)...)
			if code != 1 || e2e.LastLine(out) != c.want {
				t.Errorf("%s: exit %d, last line:\n  %s\nwant exit 1 and:\n  %s", c.name, code, e2e.LastLine(out), c.want)
			}
			noSecrets(t, c.name, out, ks.Password)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		pg := testenv.Postgres(t)
		e := &e2e.Env{T: t, DSN: withPassword(t, pg.DSN, pgSecret), Brokers: ks.SASLBrokers, Slot: testenv.UniqueName("slot")}
		e.Migrate()
		wrong := "wrong-" + testenv.UniqueName("pw")
		args := e.Args("--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", ks.User, "--log-level", "debug")
		code, out := runEnv(t, []string{"OUTBOXD_KAFKA_SASL_PASSWORD=" + wrong}, args...)
		want := fmt.Sprintf(`outboxd: Kafka: SASL authentication as %q with SCRAM-SHA-512 failed (check --kafka-sasl-username, the password and --kafka-sasl-mechanism): kafka: client has run out of available brokers to talk to: kafka server: SASL Authentication failed: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512`, ks.User)
		if code != 1 || e2e.LastLine(out) != want {
			t.Fatalf("wrong password: exit %d, last line:\n  %s\nwant exit 1 and:\n  %s", code, e2e.LastLine(out), want)
		}
		// One error: besides sarama's own debug lines, the failure is
		// reported once, by the last line.
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "SASL Authentication failed") && !strings.Contains(l, "\tDEBUG\t") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the SASL failure is reported %d times, want once:\n%s", n, out)
		}
		noSecrets(t, "outboxd output", out, wrong, ks.Password, pgSecret)
		// And no password at all: a clear configuration error.
		code, out = runEnv(t, nil, args...)
		if code != 1 || !strings.HasSuffix(out, "Kafka SASL: no password: set OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file\n") {
			t.Errorf("without a password: exit %d\n%s", code, out)
		}
	})
}

// psql finds the psql binary.
func psql(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql"); len(m) > 0 {
		return m[len(m)-1]
	}
	t.Fatal("psql not found (dev/stack deps installs it)")
	return ""
}

func TestRunAsLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	role := testenv.UniqueName("outboxd_role")
	sqlFile := filepath.Join(testenv.RepoRoot(t), "deploy", "least-privilege.sql")
	cmd := exec.Command(psql(t), "-X", "-q", "-d", e.DSN, "-v", "role="+role, "-v", "publication="+e.Slot, "-f", sqlFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql -f deploy/least-privilege.sql: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		e.Exec(fmt.Sprintf(`DROP PUBLICATION IF EXISTS %s; DROP OWNED BY %s; DROP ROLE %s`, e.Slot, role, role))
	})

	var super, createDB, createRole, repl bool
	c := e.Conn()
	err := c.QueryRow(context.Background(), `SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication FROM pg_roles WHERE rolname = $1`,
		role).Scan(&super, &createDB, &createRole, &repl)
	c.Close(context.Background())
	if err != nil || super || createDB || createRole || !repl {
		t.Fatalf("role %s: super %v createdb %v createrole %v replication %v (%v)", role, super, createDB, createRole, repl, err)
	}

	admin := e.DSN
	e.DSN = strings.Replace(admin, "postgres://postgres@", "postgres://"+role+"@", 1)
	d := e.Start() // creates the slot as the role
	e.DSN = admin
	if err := e.Write(context.Background(), e2e.Load{Writers: 2, Aggregates: 20, Total: 1000, MaxTxn: 10}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(time.Minute)
	t.Logf("as least-privilege role %s: %d events: %s", role, n, v)
	if v != (e2e.Verdict{}) {
		t.Fatalf("as the least-privilege role: %s", v)
	}
	d.Stop()

	// The role really has no access to the table's rows.
	e.DSN = strings.Replace(admin, "postgres://postgres@", "postgres://"+role+"@", 1)
	c = e.Conn()
	_, err = c.Exec(context.Background(), `SELECT count(*) FROM outbox`)
	c.Close(context.Background())
	e.DSN = admin
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("SELECT on outbox as the role: %v, want permission denied", err)
	}
}

// runEnv runs outboxd to completion with extra environment variables and
// returns its exit code and all its output.
func runEnv(t *testing.T, extraEnv []string, args ...string) (int, string) {
	t.Helper()
	p := testproc.StartEnv(t, extraEnv, e2e.BinPath, args...)
	code := p.Wait(90 * time.Second)
	return code, p.Output()
}
