package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parseRun parses run settings with a fake environment.
func parseRun(t *testing.T, env map[string]string, args ...string) (*options, map[string]string, error) {
	t.Helper()
	var o options
	fs := newFlagSet("run", &o)
	addRunFlags(fs, &o)
	fs.SetOutput(new(strings.Builder))
	src, err := parseSources(fs, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	return &o, src, err
}

func TestConfigPrecedenceFlagEnvFileDefault(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "outboxd.yaml", `
# every key is a flag name
slot: from_file
publication: from_file
table: from_file
kafka-brokers: [a:9092, b:9092]
max-in-flight-events: 7
log-json: true
hook:
  - t1=SELECT 1
  - t2=SELECT 2, 3
`)
	env := map[string]string{"OUTBOXD_PUBLICATION": "from_env", "OUTBOXD_TABLE": "from_env", "OUTBOXD_CONFIG": file}
	o, src, err := parseRun(t, env, "--table", "from_flag")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want, src, wantSrc string }{
		{o.slot.Table, "from_flag", src["table"], sourceFlag},
		{o.slot.Publication, "from_env", src["publication"], sourceEnv},
		{o.slot.Slot, "from_file", src["slot"], sourceFile},
		{o.slot.Schema, "public", src["schema"], sourceDefault},
		{o.brokers, "a:9092,b:9092", src["kafka-brokers"], sourceFile},
	} {
		if c.got != c.want || c.src != c.wantSrc {
			t.Errorf("got %q from %s, want %q from %s", c.got, c.src, c.want, c.wantSrc)
		}
	}
	if o.pub.MaxInFlightEvents != 7 || !o.logJSON || len(o.hooks) != 2 || o.hooks[1] != "t2=SELECT 2, 3" {
		t.Errorf("typed values from the file: %d %v %q", o.pub.MaxInFlightEvents, o.logJSON, o.hooks)
	}
	// --config on the command line beats OUTBOXD_CONFIG.
	other := writeFile(t, "other.yaml", "slot: from_other\n")
	if o, _, err = parseRun(t, env, "--config", other); err != nil || o.slot.Slot != "from_other" {
		t.Errorf("--config over OUTBOXD_CONFIG: slot %q, %v", o.slot.Slot, err)
	}
}

func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, yaml, want string }{
		{"typo", "slot: a\nkafka-broker: x\n", `line 2: unknown key "kafka-broker" (did you mean "kafka-brokers"?)`},
		{"unknown", "frobnicate: 1\n", `line 1: unknown key "frobnicate"`},
		{"command line only", "config: other.yaml\n", `line 1: key "config" can only be given on the command line`},
		{"nested", "kafka-brokers:\n  a: 1\n", `line 2: kafka-brokers: want a value or a list of values, not a mapping`},
		{"duplicate", "slot: a\nslot: b\n", `line 2: key "slot" given twice`},
		{"not a mapping", "- a\n- b\n", `line 1: want a mapping of settings`},
		{"bad value", "max-in-flight-events: lots\n", `line 1: max-in-flight-events: "lots": parse error`},
		{"secret value never quoted", "kafka-sasl-password: [a, b]\nmax-in-flight-events: x\n", `max-in-flight-events: "x"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, "c.yaml", c.yaml)
			_, _, err := parseRun(t, nil, "--config", path)
			var ce *ConfigError
			if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want a *ConfigError containing %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "config file "+path) {
				t.Errorf("error does not name the file: %v", err)
			}
		})
	}
	_, _, err := parseRun(t, nil, "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || !strings.Contains(err.Error(), "cannot read it") {
		t.Errorf("missing file: %v", err)
	}
	if _, _, err := parseRun(t, nil, "--config", writeFile(t, "empty.yaml", "")); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:s3cret@db:5432/x?sslmode=verify-full":   "postgres://u:REDACTED@db:5432/x?sslmode=verify-full",
		"postgresql://u@db/x?password=s3cret&sslmode=require": "postgresql://u@db/x?password=REDACTED&sslmode=require",
		"postgres://u@db/x":                                            "postgres://u@db/x",
		"host=db user=u password=s3cret dbname=x":                      "host=db user=u password=REDACTED dbname=x",
		"host=db password = 's3 cret\\'x' sslpassword=s3cret dbname=x": "host=db password = REDACTED sslpassword=REDACTED dbname=x",
	} {
		if got := redactDSN(in); got != want || strings.Contains(got, "s3") {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

// selfSigned writes a CA certificate and a key in PEM.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outboxd-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, DNSNames: []string{"kafka.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeFile(t, "cert.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyFile = writeFile(t, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	return certFile, keyFile
}

func TestKafkaSecuritySettings(t *testing.T) {
	t.Parallel()
	cert, key := selfSigned(t)
	o, _, err := parseRun(t, map[string]string{"OUTBOXD_KAFKA_SASL_PASSWORD": "pw-secret"},
		"--kafka-brokers", "k:9093", "--kafka-tls-ca-file", cert, "--kafka-tls-cert-file", cert, "--kafka-tls-key-file", key,
		"--kafka-tls-server-name", "kafka.test", "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "svc")
	if err != nil {
		t.Fatal(err)
	}
	k, err := o.kafkaConfig()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := k.Sarama()
	if err != nil {
		t.Fatal(err)
	}
	if !sc.Net.TLS.Enable || sc.Net.TLS.Config.ServerName != "kafka.test" || sc.Net.TLS.Config.RootCAs == nil ||
		len(sc.Net.TLS.Config.Certificates) != 1 {
		t.Errorf("TLS not configured: %+v", sc.Net.TLS)
	}
	if !sc.Net.SASL.Enable || sc.Net.SASL.Mechanism != "SCRAM-SHA-512" || sc.Net.SASL.User != "svc" ||
		sc.Net.SASL.Password != "pw-secret" || sc.Net.SASL.SCRAMClientGeneratorFunc == nil {
		t.Errorf("SASL not configured: mechanism %q user %q", sc.Net.SASL.Mechanism, sc.Net.SASL.User)
	}
	c := sc.Net.SASL.SCRAMClientGeneratorFunc()
	if err := c.Begin("svc", "pw-secret", ""); err != nil {
		t.Fatal(err)
	}
	if first, err := c.Step(""); err != nil || !strings.HasPrefix(first, "n,,n=svc,r=") {
		t.Errorf("SCRAM client-first %q, %v", first, err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kafka-sasl-mechanism", "GSSAPI", "--kafka-sasl-username", "u", "--kafka-sasl-password", "p-secret"}, `unknown mechanism "GSSAPI"`},
		{[]string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-password", "p-secret"}, "--kafka-sasl-username is empty"},
		{[]string{"--kafka-sasl-username", "u"}, "no --kafka-sasl-mechanism"},
		{[]string{"--kafka-tls-cert-file", cert}, "go together"},
		{[]string{"--kafka-tls-ca-file", key}, "holds no PEM certificate"},
		{[]string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-username", "u", "--kafka-sasl-password-file", "/nonexistent"}, "read --kafka-sasl-password-file"},
	} {
		o, _, err := parseRun(t, nil, append([]string{"--kafka-brokers", "k:9092"}, c.args...)...)
		if err == nil {
			_, err = o.kafkaConfig()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "p-secret") {
			t.Errorf("%v: error %v, want %q (and no secret)", c.args, err, c.want)
		}
	}
}

// TestShapeReservesTheMappingsHeaders: the decoder is told the mapping's
// own id and key header names, so a row's headers cannot set a second
// copy of Debezium's "id"; a --header-column may not take one either.
func TestShapeReservesTheMappingsHeaders(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--format", "debezium"}, []string{"id"}},
		{[]string{"--id-header", "event-id", "--key-header", "key"}, []string{"event-id", "key"}},
	} {
		o, _, err := parseRun(t, nil, tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.shape(); err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if !slices.Equal(o.decoder.ReservedHeaders, tt.want) {
			t.Errorf("%q: decoder reserves %q, want %q", tt.args, o.decoder.ReservedHeaders, tt.want)
		}
	}
	o, _, err := parseRun(t, nil, "--format", "debezium", "--header-column", "aggregateid=id")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.shape(); err == nil || !strings.Contains(err.Error(), `header "id" is one outboxd sets itself`) {
		t.Errorf("--header-column aggregateid=id under --format debezium: %v, want refused", err)
	}
}
