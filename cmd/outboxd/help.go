package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// errHelp means help was asked for and printed to stdout: exit 0.
var errHelp = errors.New("help shown")

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
func printHelp(w io.Writer, fs *flagSet) {
	fmt.Fprintf(w, "Usage: %s [flags]\n\n", fs.Name())
	fmt.Fprintln(w, "Every flag is also an environment variable (OUTBOXD_ + the name in upper case, - as _)")
	fmt.Fprintln(w, "and a key of the --config YAML file. Precedence: flag > env > file > default.")
	byGroup := make([][]*flag.Flag, len(helpGroups))
	fs.VisitAll(func(f *flag.Flag) {
		g := fs.setting(f.Name).group
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
			fmt.Fprintf(w, "%s  (%s%s)\n      %s\n", head, fs.setting(f.Name).env, def, f.Usage)
		}
	}
}

// parseError turns the flag package's error into one line that says what to
// do: a suggestion for an unknown flag, the units of a duration.
func parseError(fs *flagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		hint := ""
		if s := suggest(name, setOf(slices.Collect(maps.Keys(fs.settings)))); s != "" {
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
