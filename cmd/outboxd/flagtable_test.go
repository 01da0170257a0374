package main

import (
	"flag"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSettingsAgreeAcrossCommands: a name several commands declare is one
// setting to the environment, redaction and completion, which look it up by
// name; so its secrecy, file-ability, group and values must not depend on
// the command.
func TestSettingsAgreeAcrossCommands(t *testing.T) {
	all := allSettings()
	for _, build := range commandFlagSets {
		fs := build()
		fs.VisitAll(func(f *flag.Flag) {
			s, ok := fs.settings[f.Name]
			if !ok {
				t.Errorf("%s: --%s was declared around the flag table", fs.Name(), f.Name)
				return
			}
			want := all[f.Name]
			if s.secret != want.secret || s.cliOnly != want.cliOnly || s.group != want.group ||
				(s.redact == nil) != (want.redact == nil) || !slices.Equal(s.values, want.values) {
				t.Errorf("%s: --%s's entry differs from run's (or the first command's): %+v, want %+v", fs.Name(), f.Name, *s, *want)
			}
			if s.env != envName(f.Name) {
				t.Errorf("%s: --%s reads %s", fs.Name(), f.Name, s.env)
			}
		})
	}
}

// TestSecretsComeFromTheTable: the settings redaction hides are exactly the
// secret entries; a new password flag is one entry, not a list to extend.
func TestSecretsComeFromTheTable(t *testing.T) {
	var secrets []string
	for _, name := range settingNames() {
		if allSettings()[name].secret {
			secrets = append(secrets, name)
		}
	}
	if want := []string{"kafka-sasl-password", "pg-dsn", "schema-registry-password"}; !slices.Equal(secrets, want) {
		t.Errorf("secret settings %v, want %v", secrets, want)
	}
	for _, name := range secrets {
		if got := quoteSetting(name, "hunter2"); got != "(value not shown: secret)" {
			t.Errorf("quoteSetting(%s) = %q", name, got)
		}
	}
	for key := range knownKeys() {
		if allSettings()[key].cliOnly {
			t.Errorf("%s is a file key and command-line only", key)
		}
	}
}

// TestEveryCommandIsInTheTable: a command with flags that commandFlagSets
// does not build would be unknown to the environment's warnings, to
// completion and to configuration.md.
func TestEveryCommandIsInTheTable(t *testing.T) {
	inTable := map[string]bool{}
	for _, build := range commandFlagSets {
		inTable[strings.TrimPrefix(build().Name(), "outboxd ")] = true
	}
	withFlags := regexp.MustCompile(`(?m)^  outboxd ((?:[a-z-]+ )*?[a-z-]+) (?:\[flags\]|--)`)
	cmds := withFlags.FindAllStringSubmatch(usage, -1)
	if len(cmds) < 10 {
		t.Fatalf("found only %d commands with flags in the usage: %v", len(cmds), cmds)
	}
	for _, m := range cmds {
		if !inTable[m[1]] {
			t.Errorf("outboxd %s takes flags but is not in commandFlagSets", m[1])
		}
	}
}
