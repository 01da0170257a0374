package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestConfigurationDocsListEveryRunFlag: docs/configuration.md (and
// formats.md for the formats' settings) names every setting of run, a
// flag's own row with run's default; a flag added, renamed or given
// a new default without its row fails here, so the page cannot drift.
func TestConfigurationDocsListEveryRunFlag(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	// The settings of the formats have their page; the security settings a
	// section of bullets: a flag named there counts as documented.
	formats, err := os.ReadFile("../../docs/formats.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row of one flag gives its default; a row may name several flags
	// (`--schema`, `--table`), or a flag in its text (--format's row names
	// the shape flags it overrides): each of those counts as documented.
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| ([^|]*) \\|")
	named := regexp.MustCompile("`--([a-z0-9-]+)")
	documented := map[string]string{}
	for _, line := range strings.Split(string(b)+"\n"+string(formats), "\n") {
		if !strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "- ") {
			continue
		}
		for _, m := range named.FindAllStringSubmatch(line, -1) {
			if _, ok := documented[m[1]]; !ok {
				documented[m[1]] = ""
			}
		}
		if m := row.FindStringSubmatch(line); m != nil {
			documented[m[1]] = strings.Trim(strings.TrimSpace(m[2]), "`")
		}
	}
	var o options
	fs := newFlagSet("run", &o)
	addRunFlags(fs, &o)
	var missing []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range knownKeys() {
			if !yield(k) {
				return
			}
		}
	}) {
		def, ok := documented[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if want := f.DefValue; def != "" && want != "" && def != want {
			t.Errorf("docs/configuration.md: --%s's default is %q, run's is %q", name, def, want)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/configuration.md has no row for: --%s", strings.Join(missing, ", --"))
	}
}
