package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// errHelp means help was asked for and printed to stdout: exit 0.
var errHelp = errors.New("help shown")

// A flag's group in --help, in the order groups are printed. Groups are named
// by concern, so `outboxd run --help | grep -A20 Kafka` finds them.
var helpGroups = []string{
	"PostgreSQL connection and slot",
	"Kafka",
	"Outbox shape and routing",
	"Delivery",
	"Polling source (--source=poll)",
	"Operations",
	"Demo only (never in production)",
}

// groupExact places the flags whose group their name prefix does not tell.
var groupExact = map[string]int{
	"pg-dsn": 0, "slot": 0, "publication": 0, "schema": 0, "table": 0, "failover-slot": 0,
	"no-create": 0, "status-interval": 0, "server-timeout": 0,
	"default-topic": 2, "source": 2, "format": 2, "topic-template": 2,
	"delivery": 3, "checkpoint-topic": 3, "checkpoint-interval": 3, "checkpoint-read-timeout": 3, "accept-gap": 3,
	"dead-letter-topic": 3, "max-in-flight-events": 3, "max-in-flight-bytes": 3,
	"kafka-txn-max-events": 3, "kafka-txn-max-age": 3, "kafka-txn-timeout": 3,
	"crash-after-produce": 6,
	"value-format":        2, "key-format": 2, "subject-name-strategy": 2, "value-schema-id": 2, "value-schema-version": 2,
	"key-schema-id": 2, "key-schema-version": 2, "value-schema-file": 2, "key-schema-file": 2,
	"value-proto-message": 2, "auto-register-schemas": 2, "schema-cache-ttl": 2, "cloudevents": 2, "cloudevents-source": 2,
	"schema-registry-url": 1, "schema-registry-user": 1, "schema-registry-password": 1, "schema-registry-ca-file": 1,
}

// groupOf returns the index in helpGroups of flag name.
func groupOf(name string) int {
	if g, ok := groupExact[name]; ok {
		return g
	}
	switch {
	case strings.HasPrefix(name, "kafka-"):
		return 1
	case strings.HasPrefix(name, "poll-"):
		return 4
	case strings.HasSuffix(name, "-column") || strings.HasSuffix(name, "-header") ||
		strings.HasSuffix(name, "-encoding"):
		return 2
	}
	return 5
}

// flagType names the kind of value a flag takes, for --help.
func flagType(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "value"
	}
	switch g.Get().(type) {
	case sizeValue:
		return "size"
	case bool:
		return ""
	case time.Duration:
		return "duration"
	case int, int64, uint, uint64:
		return "int"
	case float64:
		return "float"
	}
	if _, ok := f.Value.(*stringList); ok {
		return "value (repeatable)"
	}
	return "string"
}

// printHelp writes fs's flags to w, grouped by concern, each with its type,
// environment variable and default.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s [flags]\n\n", fs.Name())
	fmt.Fprintln(w, "Every flag is also an environment variable (OUTBOXD_ + the name in upper case, - as _)")
	fmt.Fprintln(w, "and a key of the --config YAML file. Precedence: flag > env > file > default.")
	byGroup := make([][]*flag.Flag, len(helpGroups))
	fs.VisitAll(func(f *flag.Flag) {
		g := groupOf(f.Name)
		byGroup[g] = append(byGroup[g], f)
	})
	for g, flags := range byGroup {
		if len(flags) == 0 {
			continue
		}
		slices.SortFunc(flags, func(a, b *flag.Flag) int { return strings.Compare(a.Name, b.Name) })
		fmt.Fprintf(w, "\n%s:\n", helpGroups[g])
		for _, f := range flags {
			head := "  --" + f.Name
			if t := flagType(f); t != "" {
				head += " " + t
			}
			def := ""
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
				def = ", default " + f.DefValue
			}
			fmt.Fprintf(w, "%s  (%s%s)\n      %s\n", head, envName(f.Name), def, f.Usage)
		}
	}
}

// parseError turns the flag package's error into one line that says what to
// do: a suggestion for an unknown flag, the units of a duration.
func parseError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		known := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
		hint := ""
		if s := suggest(name, known); s != "" {
			hint = fmt.Sprintf(" (did you mean --%s?)", s)
		}
		return usageErrorf("unknown flag --%s%s; see %q", name, hint, fs.Name()+" --help")
	}
	// "invalid value %q for flag -%s: %v"
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if i := strings.Index(rest, " for flag -"); i >= 0 {
			name := rest[i+len(" for flag -"):]
			if j := strings.Index(name, ":"); j >= 0 {
				name = name[:j]
			}
			name = strings.TrimLeft(name, "-")
			if f := fs.Lookup(name); f != nil {
				return usageErrorf("--%s %s: %s", name, rest[:i], valueHint(f))
			}
		}
	}
	return usageErrorf("%v; see %q", err, fs.Name()+" --help")
}

// UsageError is a command line that cannot be parsed: printed as one line,
// exit status 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usageErrorf(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// valueHint says what a flag's value must look like.
func valueHint(f *flag.Flag) string {
	switch flagType(f) {
	case "duration":
		return "want a duration with a unit, e.g. 30s, 5m, 1h30m, 250ms"
	case "int":
		return "want a whole number"
	case "size":
		return "want a size: bytes, or a number with a unit, e.g. 64MiB, 900KB, 1GiB"
	case "":
		return "want true or false"
	}
	return "invalid value"
}

// durationHint adds the units to a duration parse error from the environment
// or a config file.
func durationHint(f *flag.Flag, err error) error {
	if flagType(f) == "duration" {
		return fmt.Errorf("%w (%s)", err, valueHint(f))
	}
	return err
}
