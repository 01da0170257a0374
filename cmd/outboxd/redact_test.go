package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// The secret in every form below; none of the outputs may hold it.
const secretPW = "s3cretPW"

// dsnForms are --pg-dsn values as operators write them, templated env files
// produce them, and typos make them.
var dsnForms = []string{
	"postgres://u:" + secretPW + "@db/app",
	" postgres://u:" + secretPW + "@db/app",
	"\tpostgres://u:" + secretPW + "@db/app\n",
	"POSTGRES://u:" + secretPW + "@db/app",
	"PostgreSQL://u:" + secretPW + "@db:5432/app?sslmode=require",
	"postgres//u:" + secretPW + "@db/app",
	"pg://u:" + secretPW + "@db/app",
	"u:" + secretPW + "@db/app",
	"postgres://u@db/app?password=" + secretPW,
	"postgres://u@db/app?PassWord=" + secretPW + "&sslmode=disable",
	"host=db password=" + secretPW + " dbname=app",
	"host=db PASSWORD = '" + secretPW + " x' dbname=app",
	"host=db sslpassword=" + secretPW,
	"postgres://u:" + secretPW + "@db/app%zz", // an invalid escape: url.Parse fails
	"postgres://u:" + secretPW + "@[::1/app",  // an invalid host
	secretPW,
}

// urlForms are values of flags that are not secrets themselves but can hold
// a URL with credentials (the Schema Registry's).
var urlForms = []string{
	"http://user:" + secretPW + "@reg:8081",
	"HTTPS://user:" + secretPW + "@reg:8081/apis/ccompat/v7",
	"http://reg-a:8081,http://user:" + secretPW + "@reg-b:8081",
	" http://user:" + secretPW + "@reg:8081",
}

func TestRedactSettingHidesEveryFormOfASecret(t *testing.T) {
	t.Parallel()
	for _, v := range dsnForms {
		if got := redactSetting("pg-dsn", v); strings.Contains(got, secretPW) {
			t.Errorf("redactSetting(pg-dsn, %q) = %q: shows the password", v, got)
		}
		if got := quoteSetting("pg-dsn", v); strings.Contains(got, secretPW) {
			t.Errorf("quoteSetting(pg-dsn, %q) = %q: shows the password", v, got)
		}
	}
	for _, v := range urlForms {
		if got := redactSetting("schema-registry-url", v); strings.Contains(got, secretPW) || !strings.Contains(got, "reg") {
			t.Errorf("redactSetting(schema-registry-url, %q) = %q: want the URL without its password", v, got)
		}
	}
	for _, name := range []string{"kafka-sasl-password", "schema-registry-password"} {
		if got := redactSetting(name, secretPW); got != redacted {
			t.Errorf("redactSetting(%s) = %q, want %s", name, got, redacted)
		}
	}
	// What carries no secret is shown as it is.
	for name, v := range map[string]string{"pg-dsn": "postgres://u@db/app?sslmode=disable", "schema-registry-url": "http://reg:8081", "slot": "outboxd"} {
		if got := redactSetting(name, v); got != v {
			t.Errorf("redactSetting(%s, %q) = %q, want it unchanged", name, v, got)
		}
	}
}

// config check's output goes to the journal (the systemd unit's
// ExecStartPre): each form, given as a flag and as an environment variable,
// valid or not, leaves no trace of the password on stdout or stderr.
func TestConfigCheckPrintsNoSecret(t *testing.T) {
	if e2e.BinPath == "" {
		t.Skip("the binary is built only without -short")
	}
	t.Parallel()
	checked := 0
	run := func(env []string, args ...string) {
		t.Helper()
		cmd := exec.Command(e2e.BinPath, append([]string{"config", "check", "--kafka-brokers", "k:9092"}, args...)...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run() // valid or not: only the output matters here
		if strings.Contains(out.String(), "unknown flag") {
			t.Fatalf("outboxd config check %q: %s", args, out.String())
		}
		if strings.Contains(out.String(), secretPW) {
			t.Errorf("outboxd config check %q (env %q) printed the password:\n%s", args, env, out.String())
		}
		checked++
	}
	for _, v := range dsnForms {
		run(nil, "--pg-dsn", v)
		run([]string{"OUTBOXD_PG_DSN=" + v})
		// A flag whose value was left out takes the next flag as its
		// value, and the DSN is left over as an argument.
		run(nil, "--slot", "--pg-dsn", v)
	}
	for _, v := range urlForms {
		run(nil, "--pg-dsn", "postgres://u@db/app", "--value-format", "avro", "--schema-registry-url", v)
		run([]string{"OUTBOXD_SCHEMA_REGISTRY_URL=" + v}, "--pg-dsn", "postgres://u@db/app", "--value-format", "avro")
	}
	run(nil, "--pg-dsn", "postgres://u@db/app", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-username", "u", "--kafka-sasl-password", secretPW)
	run([]string{"OUTBOXD_SCHEMA_REGISTRY_PASSWORD=" + secretPW}, "--pg-dsn", "postgres://u@db/app")
	t.Logf("%d forms of a secret, %d config check runs: none printed it", len(dsnForms)+len(urlForms)+2, checked)
	var out bytes.Buffer
	cmd := exec.Command(e2e.BinPath, "config", "check", "--slot", "--pg-dsn", "postgres://u:"+secretPW+"@db/app")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil || !strings.Contains(out.String(), "1 unexpected argument after --pg-dsn") {
		t.Errorf("a DSN left over after a flag without its value: %v, %s; want it named as an argument after --pg-dsn", err, out.String())
	}
}

// What connects prints more than config check: config check --connect
// reports each server it could not reach, and run logs its settings at
// start (at debug level, every one) and then the error that ends it. With
// the shared Kafka when there is one, so that start-up gets as far as
// PostgreSQL, whose host does not resolve: every form of the DSN reaches
// the connect error. No output of either may hold the password.
func TestConnectingCommandsPrintNoSecret(t *testing.T) {
	if e2e.BinPath == "" {
		t.Skip("the binary is built only without -short")
	}
	t.Parallel()
	brokers := "k:9092"
	if b := testenv.KafkaBrokers(); len(b) > 0 {
		brokers = strings.Join(b, ",")
	}
	outputs := 0
	run := func(env []string, args ...string) {
		t.Helper()
		cmd := exec.Command(e2e.BinPath, args...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err == nil {
			t.Fatalf("outboxd %q succeeded; want the failure whose message is checked:\n%s", args, out.String())
		}
		if strings.Contains(out.String(), "unknown flag") {
			t.Fatalf("outboxd %q: %s", args, out.String())
		}
		if strings.Contains(out.String(), secretPW) {
			t.Errorf("outboxd %q (env %q) printed the password:\n%s", args, env, out.String())
		}
		outputs++
	}
	runArgs := []string{"run", "--kafka-brokers", brokers, "--start-timeout", "0", "--log-level", "debug", "--slot", "outboxd_secret_test"}
	for _, v := range dsnForms {
		run(nil, "config", "check", "--connect", "--kafka-brokers", brokers, "--pg-dsn", v)
		run([]string{"OUTBOXD_PG_DSN=" + v}, "config", "check", "--connect", "--kafka-brokers", brokers)
		run(nil, append(runArgs, "--pg-dsn", v)...)
		run([]string{"OUTBOXD_PG_DSN=" + v}, runArgs...)
	}
	for _, v := range urlForms {
		run(nil, append(runArgs, "--pg-dsn", "postgres://u@db/app", "--value-format", "avro", "--schema-registry-url", v)...)
	}
	run(nil, append(runArgs, "--pg-dsn", "postgres://u@db/app", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-username", "u", "--kafka-sasl-password", secretPW)...)
	t.Logf("%d forms of a secret, %d outputs of config check --connect and run (start-up log at debug, errors): none printed it",
		len(dsnForms)+len(urlForms)+1, outputs)
}
