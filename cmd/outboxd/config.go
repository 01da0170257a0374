package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Settings come from four places. For each flag the first that has it wins:
//
//  1. the command line (--name value);
//  2. the environment (OUTBOXD_NAME);
//  3. the YAML file given by --config (or OUTBOXD_CONFIG): a flat mapping
//     whose keys are the flag names (pg-dsn: ..., kafka-brokers: ...);
//  4. the flag's default.
//
// A key the file does not know is an error, so that a typo never silently
// leaves a setting at its default. Keys that belong to another command (the
// run settings in a file read by "outboxd status") are accepted and ignored.

// Where a setting came from, as config check prints it.
const (
	sourceFlag    = "flag"
	sourceEnv     = "env"
	sourceFile    = "file"
	sourceDefault = "default"
)

// configFlag names the file of settings; it cannot itself be set in a file.
const configFlag = "config"

// ConfigError is a bad --config file: unreadable, not YAML, or a key or value
// that is not a setting.
type ConfigError struct {
	Path string
	Line int // 0 when not about one line
	Msg  string
	Err  error
}

func (e *ConfigError) Error() string {
	where := "config file " + e.Path
	if e.Line > 0 {
		where += fmt.Sprintf(" line %d", e.Line)
	}
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", where, e.Msg, e.Err)
	}
	return where + ": " + e.Msg
}

func (e *ConfigError) Unwrap() error { return e.Err }

// fileValue is one setting read from the file.
type fileValue struct {
	line   int
	values []string // one per item of a YAML sequence, else one
}

// knownKeys are the keys a config file may hold: every setting of "run"
// (a superset of the other commands' settings) but those only the command
// line may give.
func knownKeys() map[string]bool {
	keys := map[string]bool{}
	for name, s := range runFlags(new(options)).settings {
		if !s.cliOnly {
			keys[name] = true
		}
	}
	return keys
}

// readConfigFile reads path as a flat YAML mapping of settings.
func readConfigFile(path string) (map[string]fileValue, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Path: path, Msg: "cannot read it", Err: err}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return map[string]fileValue{}, nil // an empty file
		}
		return nil, &ConfigError{Path: path, Msg: "not valid YAML", Err: err}
	}
	if len(doc.Content) == 0 {
		return map[string]fileValue{}, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, &ConfigError{Path: path, Line: root.Line, Msg: "want a mapping of settings (key: value), one key per flag name"}
	}
	known := knownKeys()
	out := map[string]fileValue{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		if !known[key] {
			msg := fmt.Sprintf("unknown key %q", key)
			if s := suggest(key, known); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			} else if st, ok := allSettings()[key]; ok && st.cliOnly {
				msg = fmt.Sprintf("key %q can only be given on the command line", key)
			}
			return nil, &ConfigError{Path: path, Line: k.Line, Msg: msg}
		}
		if _, dup := out[key]; dup {
			return nil, &ConfigError{Path: path, Line: k.Line, Msg: fmt.Sprintf("key %q given twice", key)}
		}
		fv := fileValue{line: v.Line}
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag == "!!null" {
				continue // "key:" with no value: as if absent
			}
			fv.values = []string{v.Value}
		case yaml.SequenceNode:
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return nil, &ConfigError{Path: path, Line: item.Line, Msg: fmt.Sprintf("%s: want a list of plain values", key)}
				}
				fv.values = append(fv.values, item.Value)
			}
		default:
			return nil, &ConfigError{Path: path, Line: v.Line, Msg: fmt.Sprintf("%s: want a value or a list of values, not a mapping", key)}
		}
		out[key] = fv
	}
	return out, nil
}

// suggest returns the known key closest to key, if it is close.
func suggest(key string, known map[string]bool) string {
	best, bestD := "", 3
	for k := range known {
		if d := editDistance(key, k); d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	if bestD > 2 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// resolve fills every flag not given on the command line from the
// environment, then from the config file, and returns where each setting came
// from. set are the flags given on the command line.
func resolve(fs *flagSet, set map[string]bool, lookupEnv func(string) (string, bool)) (map[string]string, error) {
	path := ""
	if f := fs.Lookup(configFlag); f != nil {
		path = f.Value.String()
		if !set[configFlag] {
			if v, ok := lookupEnv(fs.setting(configFlag).env); ok {
				path = v
				_ = f.Value.Set(v)
			}
		}
	}
	var file map[string]fileValue
	if path != "" {
		var err error
		if file, err = readConfigFile(path); err != nil {
			return nil, err
		}
	}
	sources := map[string]string{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case set[f.Name]:
			sources[f.Name] = sourceFlag
		case f.Name == configFlag:
			sources[f.Name] = sourceDefault
			if path != "" {
				sources[f.Name] = sourceEnv
			}
		default:
			env := fs.setting(f.Name).env
			if v, ok := lookupEnv(env); ok {
				sources[f.Name] = sourceEnv
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, fmt.Errorf("%s=%s: %w", env, quoteSetting(f.Name, v), durationHint(f, err)))
				}
				return
			}
			fv, ok := file[f.Name]
			if !ok {
				sources[f.Name] = sourceDefault
				return
			}
			sources[f.Name] = sourceFile
			vals := fv.values
			if _, repeatable := f.Value.(*stringList); !repeatable {
				vals = []string{strings.Join(vals, ",")}
			}
			for _, v := range vals {
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, &ConfigError{Path: path, Line: fv.line,
						Msg: fmt.Sprintf("%s: %s", f.Name, quoteSetting(f.Name, v)), Err: durationHint(f, err)})
				}
			}
		}
	})
	return sources, errors.Join(errs...)
}

// sortedFlags are fs's flags in name order, without the help-only ones.
func sortedFlags(fs *flagSet) []*flag.Flag {
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	slices.SortFunc(fl, func(a, b *flag.Flag) int { return strings.Compare(a.Name, b.Name) })
	return fl
}

// configCheckFlags are run's flags and --connect.
func configCheckFlags(o *options) (*flagSet, *bool) {
	fs := newFlagSet("config check", o)
	addRunFlags(fs, o)
	connect := fs.Bool(connectFlag, false, "also connect: check PostgreSQL (role, wal_level, table, slot) and Kafka (reachable, authenticated) as run does at start, creating nothing, and print a checklist", cliOnly)
	return fs, connect
}

// cmdConfigCheck validates the run settings and prints them as a config file
// would hold them, secrets redacted, each with where it came from.
func cmdConfigCheck(ctx context.Context, args []string) error {
	var o options
	fs, connect := configCheckFlags(&o)
	warnUnknownEnv(os.Stderr, lookupEnvNames())
	sources, err := parseSources(fs, args, os.LookupEnv)
	if err != nil {
		return err
	}
	w := os.Stdout
	fmt.Fprintln(w, "# outboxd run: effective configuration (precedence: flag > env > file > default)")
	if p := fs.Lookup(configFlag).Value.String(); p != "" {
		fmt.Fprintf(w, "# config file: %s\n", p)
	}
	for _, f := range sortedFlags(fs) {
		// What a file cannot hold is not printed as a file would hold it.
		if fs.setting(f.Name).cliOnly {
			continue
		}
		src := sources[f.Name]
		if src == sourceEnv {
			src += " " + fs.setting(f.Name).env
		}
		var val string
		if l, ok := f.Value.(*stringList); ok {
			items := make([]string, len(*l))
			for i, v := range *l {
				items[i] = strconv.Quote(redactSetting(f.Name, v))
			}
			val = "[" + strings.Join(items, ", ") + "]"
		} else {
			val = yamlScalar(redactSetting(f.Name, f.Value.String()))
		}
		fmt.Fprintf(w, "%s: %s # %s\n", f.Name, val, src)
	}
	kcfg, err := o.validateRun()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "config check: valid (Kafka %s: %s)\n", strings.Join(kcfg.Brokers, ","), o.kafkaSec.Describe())
	if *connect {
		return connectCheck(ctx, os.Stderr, &o, kcfg)
	}
	return nil
}

var plainScalar = regexp.MustCompile(`^[A-Za-z0-9_./=+][A-Za-z0-9_./=+@:,%?&-]*$`)

// yamlScalar renders s as a YAML scalar that reads back, as a setting, the
// same: plain when it is safe (settings are read as text, so 0 and true need
// no quotes), quoted otherwise.
func yamlScalar(s string) string {
	if plainScalar.MatchString(s) && !strings.Contains(s, ": ") {
		return s
	}
	b, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Sprintf("%q", s)
	}
	return strings.TrimSuffix(string(b), "\n")
}
