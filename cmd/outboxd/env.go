package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Environment variables that start with OUTBOXD_ but belong to the dev stack,
// the tests or the benchmark, not to a setting.
var devEnvPrefixes = []string{"OUTBOXD_STACK_", "OUTBOXD_DEBEZIUM_", "OUTBOXD_BENCH_", "OUTBOXD_TEST_", "OUTBOXD_E2E_"}
var devEnvNames = map[string]bool{"OUTBOXD_PG_VERSION": true, "OUTBOXD_KAFKA_NODES": true, "OUTBOXD_CLUSTER_LOG": true}

// knownEnv are the environment variables of every setting of every command.
func knownEnv() map[string]bool {
	known := map[string]bool{}
	for _, s := range allSettings() {
		known[s.env] = true
	}
	return known
}

// lookupEnvNames lists the names of the process's environment variables.
func lookupEnvNames() []string {
	env := os.Environ()
	names := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok {
			names = append(names, k)
		}
	}
	return names
}

// warnUnknownEnv writes one line for each OUTBOXD_* variable that no
// setting reads, with the nearest real name: a typo in a unit file must not
// leave a setting silently at its default.
func warnUnknownEnv(w io.Writer, names []string) {
	var known map[string]bool
	slices.Sort(names)
	for _, name := range names {
		if !strings.HasPrefix(name, "OUTBOXD_") || devEnvNames[name] ||
			slices.ContainsFunc(devEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		if known == nil {
			known = knownEnv()
		}
		if known[name] {
			continue
		}
		hint := ""
		if s := suggest(name, known); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		fmt.Fprintf(w, "outboxd: warning: environment variable %s is not a setting and is ignored%s\n", name, hint)
	}
}
