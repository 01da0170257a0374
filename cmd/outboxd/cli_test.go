package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

// TestCLIExitCodesAndStreams runs the real binary: help goes to stdout with
// exit 0, a bad command line is one line on stderr with exit 2.
func TestCLIExitCodesAndStreams(t *testing.T) {
	if e2e.BinPath == "" {
		t.Skip("the binary is built only without -short")
	}
	for _, c := range []struct {
		args       []string
		code       int
		stdout     string // substring of stdout
		stderr     string // substring of stderr
		maxErrLine int    // most stderr lines (0: any)
	}{
		{[]string{"run", "--help"}, 0, "\nKafka:\n", "", 0},
		{[]string{"run", "-h"}, 0, "--kafka-brokers string", "", 0},
		{[]string{"help", "run"}, 0, "Delivery:", "", 0},
		{[]string{"slot", "--help"}, 0, "outboxd slot create", "", 0},
		{[]string{"config", "--help"}, 0, "outboxd config check", "", 0},
		{[]string{"--version"}, 0, "outboxd ", "", 0},
		{[]string{"version"}, 0, "go1.", "", 0},
		{[]string{"help"}, 0, "outboxd version", "", 0},
		{[]string{"run", "--pg-dns", "x"}, 2, "", "did you mean --pg-dsn?", 1},
		{[]string{"run", "--shutdown-timeout", "30"}, 2, "", "e.g. 30s", 1},
		{[]string{"slto"}, 2, "", `did you mean "slot"?`, 1},
		{[]string{"slot", "stauts"}, 2, "", `did you mean "status"?`, 1},
		// A range that selects nothing is refused before anything connects
		// (both addresses are closed; --resume would create the slot).
		{[]string{"replay", "--pg-dsn", "postgres://u@127.0.0.1:1/x", "--kafka-brokers", "127.0.0.1:1", "--from-id", "5", "--to-id", "1", "--resume"},
			1, "", "--to-id 1 is below --from-id 5", 1},
	} {
		cmd := exec.Command(e2e.BinPath, c.args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errb.String(), c.stderr) {
			t.Errorf("outboxd %v: exit %d, stdout %.200q, stderr %.300q; want exit %d, stdout ∋ %q, stderr ∋ %q",
				c.args, code, out.String(), errb.String(), c.code, c.stdout, c.stderr)
		}
		if n := strings.Count(strings.TrimSpace(errb.String()), "\n") + 1; c.maxErrLine > 0 && n > c.maxErrLine {
			t.Errorf("outboxd %v: %d lines on stderr, want at most %d: %q", c.args, n, c.maxErrLine, errb.String())
		}
	}
}

// TestValidateRunRefusesWhatRunCannotDo: every contradictory or ignored
// setting config check used to call valid is refused, by the one validation
// run and config check share.
func TestValidateRunRefusesWhatRunCannotDo(t *testing.T) {
	base := []string{"--pg-dsn", "postgres://u@db:5432/app", "--kafka-brokers", "k1:9092"}
	if _, _, err := parseRun(t, nil, base...); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pg-dsn", "not a dsn"}, "--pg-dsn"},
		{[]string{"--pg-dsn", "mysql://u:secretpw@h/db"}, "a mysql:// URL is not a PostgreSQL connection string"},
		{[]string{"--source", "poll", "--delivery", "exactly-once"}, "--source=poll publishes at-least-once only"},
		{[]string{"--poll-workers", "0"}, "--poll-workers 0"},
		{[]string{"--retention", "-5h"}, "--retention -5h0m0s"},
		{[]string{"--kafka-brokers", "kafka"}, `"kafka" is not host:port`},
		{[]string{"--kafka-brokers", "kafka:99999"}, "port"},
		{[]string{"--source", "pol"}, `--source "pol"`},
		{[]string{"--slot-poll-interval", "0"}, "--slot-poll-interval 0s: must be > 0"},
		{[]string{"--stall-timeout", "0"}, "--stall-timeout 0s: must be > 0"},
		{[]string{"--kafka-linger", "-1s"}, "--kafka-linger -1s: must be ≥ 0"},
		{[]string{"--schema-cache-ttl", "-1s"}, "--schema-cache-ttl -1s: must be ≥ 0"},
		{[]string{"--start-timeout", "-1s"}, "--start-timeout -1s: must be ≥ 0"},
		{[]string{"--checkpoint-topic", "bad topic!"}, "--checkpoint-topic: topic name \"bad topic!\""},
		{[]string{"--dead-letter-topic", "bad topic!"}, "--dead-letter-topic: topic name"},
		{[]string{"--default-topic", ".."}, "--default-topic: topic name \"..\""},
		{[]string{"--default-topic", strings.Repeat("t", 250)}, "at most 249"},
		{[]string{"--dead-letter-topic", "outboxd.checkpoints"}, "give it a topic of its own"},
		{[]string{"--value-format", "avro", "--schema-registry-url", "registry:8081"}, "want http://host:port"},
		{[]string{"--value-format", "avro", "--schema-registry-url", "ftp://u:secretpw@registry:8081"}, "want http://host:port"},
		{[]string{"--value-format", "avro", "--schema-registry-url", "http://r:8081", "--schema-registry-ca-file", "/nonexistent/ca.pem"}, "--schema-registry-ca-file"},
	} {
		o, _, err := parseRun(t, nil, append(append([]string{}, base...), c.args...)...)
		if err != nil {
			t.Fatalf("%v: parse: %v", c.args, err)
		}
		_, err = o.validateRun()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secretpw") {
			t.Errorf("%v: the error quotes the password: %v", c.args, err)
		}
	}
	o, _, err := parseRun(t, nil, base...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.validateRun(); err != nil {
		t.Errorf("a valid configuration was refused: %v", err)
	}
}

func TestUnknownEnvironmentVariablesAreNamedWithASuggestion(t *testing.T) {
	var w strings.Builder
	warnUnknownEnv(&w, []string{"OUTBOXD_KAFKA_BROKER", "OUTBOXD_PG_DSN", "OUTBOXD_KAFKA_NODES", "OUTBOXD_STACK_START_TIMEOUT", "HOME", "OUTBOXD_SINCE"})
	got := w.String()
	if !strings.Contains(got, "OUTBOXD_KAFKA_BROKER is not a setting") || !strings.Contains(got, "did you mean OUTBOXD_KAFKA_BROKERS?") {
		t.Errorf("no warning for the typo: %q", got)
	}
	if n := strings.Count(got, "\n"); n != 1 {
		t.Errorf("%d warnings, want only the typo's: %q", n, got)
	}
}

func TestEveryRunFlagIsInAGroupAndDemoFlagsLast(t *testing.T) {
	var o options
	fs := newFlagSet("run", &o)
	addRunFlags(fs, &o)
	var help strings.Builder
	printHelp(&help, fs)
	h := help.String()
	if i, j := strings.Index(h, "Demo only"), strings.Index(h, "--crash-after-produce"); i < 0 || j < i {
		t.Errorf("--crash-after-produce is not under the demo-only group at the end")
	}
	if i, j := strings.Index(h, "\nKafka:"), strings.Index(h, "--kafka-compression"); i < 0 || j < i || j > strings.Index(h, "\nOutbox shape") {
		t.Errorf("--kafka-compression is not in the Kafka group")
	}
}

// TestBashCompletionCompletesCommandsAndFlags sources the generated script
// in a real bash and asks it for completions.
func TestBashCompletionCompletesCommandsAndFlags(t *testing.T) {
	var script strings.Builder
	if err := cmdCompletion(&script, []string{"bash"}); err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, "outboxd.bash", script.String())
	for _, c := range []struct{ words, cword, want string }{
		{"outboxd sl", "1", "slot"},
		{"outboxd run --kafka-br", "2", "--kafka-brokers"},
		{"outboxd slot st", "2", "status"},
		{"outboxd run --delivery ex", "3", "exactly-once"},
		{"outboxd migrate --source p", "3", "poll"},
	} {
		out, err := exec.Command("bash", "-c", `source "$1"; read -ra COMP_WORDS <<< "$2"; COMP_CWORD=$3; _outboxd; echo "${COMPREPLY[*]}"`,
			"bash", file, c.words, c.cword).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("complete %q: %q (%v), want %q", c.words, out, err, c.want)
		}
	}
	if err := cmdCompletion(&script, []string{"fish"}); err == nil {
		t.Error("an unknown shell was accepted")
	}
}

func TestByteSizesTakeUnits(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "64MiB": 64 << 20, "900KB": 900_000, "900kB": 900_000,
		"1GiB": 1 << 30, "2 MiB": 2 << 20, "0": 0, "5B": 5} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"64M", "-1", "1.5GiB", "MiB", "99999999999TiB"} {
		if _, err := parseByteSize(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	o, _, err := parseRun(t, map[string]string{"OUTBOXD_KAFKA_MAX_MESSAGE_BYTES": "2MiB"}, "--max-in-flight-bytes", "16MiB")
	if err != nil || o.pub.MaxInFlightBytes != 16<<20 || o.maxMessageBytes != 2<<20 {
		t.Errorf("16MiB, 2MiB: got %d, %d (%v)", o.pub.MaxInFlightBytes, o.maxMessageBytes, err)
	}
	if _, _, err := parseRun(t, nil, "--kafka-max-message-bytes", "4GiB"); err == nil {
		t.Error("a record limit above 2 GiB was accepted")
	}
}
