package main

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// The flag table. Every setting of every command is declared once, through a
// flagSet, and its declaration carries what the rest of the command line
// needs to know about it: its help group, whether it is a secret, whether a
// --config file may hold it, the values completion offers and, when the page
// says more than --help, its text in docs/configuration.md. Help, redaction,
// the config file's keys, the environment's names, completion, the
// did-you-mean lists and configuration.md's tables all read this table, so a
// flag added in one place is everywhere at once.

// group is a setting's group in --help and in configuration.md, in the order
// groups are printed.
type group int

const (
	groupPG group = iota
	groupKafka
	groupShape
	groupDelivery
	groupPoll
	groupOps
	groupDemo
)

// helpGroups are named by concern, so `outboxd run --help | grep -A20 Kafka`
// finds them.
var helpGroups = []string{
	groupPG:       "PostgreSQL connection and slot",
	groupKafka:    "Kafka",
	groupShape:    "Outbox shape and routing",
	groupDelivery: "Delivery",
	groupPoll:     "Polling source (--source=poll)",
	groupOps:      "Operations",
	groupDemo:     "Demo only (never in production)",
}

// groupDocs say, in configuration.md, where a group's background is.
var groupDocs = map[group]string{
	groupKafka:    "TLS and SASL: [Security](#security); the Schema Registry: [formats](formats.md)",
	groupShape:    "[shapes](shapes.md) and [formats](formats.md) say what each shape and format writes",
	groupDelivery: "[delivery modes](guarantees.md#delivery-modes-at-least-once-and-exactly-once)",
}

// setting is one flag's entry in the table.
type setting struct {
	name  string
	env   string // its environment variable
	group group
	// secret: config check prints it redacted and errors about it never
	// quote its value.
	secret bool
	// redact, when set, shows a secret-bearing value without its secret
	// (pg-dsn: all but the password) instead of not at all.
	redact func(string) string
	// cliOnly settings cannot be keys of a --config file: the file itself,
	// and what makes no sense in a file shared by several commands.
	cliOnly bool
	values  []string // the values shell completion offers
	doc     string   // configuration.md's text, when it says more than usage
}

// opt sets a property of a setting where it is declared.
type opt func(*setting)

func in(g group) opt { return func(s *setting) { s.group = g } }

var (
	inPG       = in(groupPG)
	inKafka    = in(groupKafka)
	inShape    = in(groupShape)
	inDelivery = in(groupDelivery)
	inPoll     = in(groupPoll)
	inOps      = in(groupOps)
	inDemo     = in(groupDemo)
)

func secret(s *setting)  { s.secret = true }
func cliOnly(s *setting) { s.cliOnly = true }

func redactWith(f func(string) string) opt { return func(s *setting) { s.redact = f } }
func choices(v ...string) opt              { return func(s *setting) { s.values = v } }
func doc(text string) opt                  { return func(s *setting) { s.doc = text } }

// flagSet is a flag.FlagSet that records each flag's setting. A flag
// declared without a group is an operation's.
type flagSet struct {
	*flag.FlagSet
	settings map[string]*setting
}

func newSettings(name string) *flagSet {
	return &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), settings: map[string]*setting{}}
}

func (fs *flagSet) record(name string, opts []opt) {
	s := &setting{name: name, env: envName(name), group: groupOps}
	for _, o := range opts {
		o(s)
	}
	fs.settings[name] = s
}

// setting returns the entry of a flag of fs.
func (fs *flagSet) setting(name string) *setting {
	if s, ok := fs.settings[name]; ok {
		return s
	}
	// Unreachable for flags declared through fs; a default keeps a flag
	// added behind its back visible.
	return &setting{name: name, env: envName(name), group: groupOps}
}

func (fs *flagSet) StringVar(p *string, name, value, usage string, opts ...opt) {
	fs.FlagSet.StringVar(p, name, value, usage)
	fs.record(name, opts)
}

func (fs *flagSet) String(name, value, usage string, opts ...opt) *string {
	p := new(string)
	fs.StringVar(p, name, value, usage, opts...)
	return p
}

func (fs *flagSet) BoolVar(p *bool, name string, value bool, usage string, opts ...opt) {
	fs.FlagSet.BoolVar(p, name, value, usage)
	fs.record(name, opts)
}

func (fs *flagSet) Bool(name string, value bool, usage string, opts ...opt) *bool {
	p := new(bool)
	fs.BoolVar(p, name, value, usage, opts...)
	return p
}

func (fs *flagSet) IntVar(p *int, name string, value int, usage string, opts ...opt) {
	fs.FlagSet.IntVar(p, name, value, usage)
	fs.record(name, opts)
}

func (fs *flagSet) Int(name string, value int, usage string, opts ...opt) *int {
	p := new(int)
	fs.IntVar(p, name, value, usage, opts...)
	return p
}

func (fs *flagSet) Int64Var(p *int64, name string, value int64, usage string, opts ...opt) {
	fs.FlagSet.Int64Var(p, name, value, usage)
	fs.record(name, opts)
}

func (fs *flagSet) Int64(name string, value int64, usage string, opts ...opt) *int64 {
	p := new(int64)
	fs.Int64Var(p, name, value, usage, opts...)
	return p
}

func (fs *flagSet) DurationVar(p *time.Duration, name string, value time.Duration, usage string, opts ...opt) {
	fs.FlagSet.DurationVar(p, name, value, usage)
	fs.record(name, opts)
}

func (fs *flagSet) Duration(name string, value time.Duration, usage string, opts ...opt) *time.Duration {
	p := new(time.Duration)
	fs.DurationVar(p, name, value, usage, opts...)
	return p
}

func (fs *flagSet) Var(v flag.Value, name, usage string, opts ...opt) {
	fs.FlagSet.Var(v, name, usage)
	fs.record(name, opts)
}

func (fs *flagSet) Func(name, usage string, fn func(string) error, opts ...opt) {
	fs.FlagSet.Func(name, usage, fn)
	fs.record(name, opts)
}

// adopt records the flags another package declares on a plain
// flag.FlagSet (kafka.Security.AddFlags, which the consumer package's
// programs share): each gets common, and the one named in each gets its
// own options too.
func (fs *flagSet) adopt(add func(*flag.FlagSet), common []opt, each map[string][]opt) {
	before := map[string]bool{}
	fs.FlagSet.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	add(fs.FlagSet)
	fs.FlagSet.VisitAll(func(f *flag.Flag) {
		if !before[f.Name] {
			fs.record(f.Name, append(slices.Clone(common), each[f.Name]...))
		}
	})
	for name := range each {
		if before[name] || fs.Lookup(name) == nil {
			panic(fmt.Sprintf("adopt: %s declared no flag --%s", fs.Name(), name))
		}
	}
}

// commandFlagSets build the flag set of every command that has flags, for
// what must know every setting of every command: the environment's names,
// completion, redaction by name. A command's flags are declared in its
// xxxFlags function, which its cmdXxx parses with.
var commandFlagSets = []func() *flagSet{
	func() *flagSet { return runFlags(new(options)) },
	func() *flagSet { return migrateFlags(new(options)) },
	func() *flagSet { return newFlagSet("slot create", new(options)) },
	func() *flagSet { return slotDropFlags(new(options)) },
	func() *flagSet { return newFlagSet("slot status", new(options)) },
	func() *flagSet { fs, _ := statusFlags(new(options)); return fs },
	func() *flagSet { fs, _ := replayFlags(new(options)); return fs },
	func() *flagSet { fs, _ := pruneFlags(new(options)); return fs },
	func() *flagSet { fs, _ := auditFlags(new(options)); return fs },
	func() *flagSet { fs, _ := checkpointResetFlags(new(options)); return fs },
	func() *flagSet { fs, _ := emitKeyRotateFlags(new(options)); return fs },
	func() *flagSet { fs, _ := configCheckFlags(new(options)); return fs },
}

// allSettings are the settings of every command by name. A name several
// commands declare is one setting: where it differs it is the first
// command's (run's), and TestSettingsAgreeAcrossCommands keeps secret and
// cliOnly the same everywhere.
var allSettings = sync.OnceValue(func() map[string]*setting {
	all := map[string]*setting{}
	for _, build := range commandFlagSets {
		for name, s := range build().settings {
			if _, ok := all[name]; !ok {
				all[name] = s
			}
		}
	}
	return all
})

// settingNames are the names of allSettings, sorted.
func settingNames() []string {
	return slices.Sorted(maps.Keys(allSettings()))
}

func setOf(names []string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}
