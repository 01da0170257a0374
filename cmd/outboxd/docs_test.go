package main

import (
	"os"
	"strings"
	"testing"
)

// TestConfigurationDocsAreGenerated: the settings of docs/configuration.md
// are what make docs generates from the flag table, so a flag added,
// renamed, regrouped or given a new default or text fails here until the
// page is regenerated: the page cannot drift.
func TestConfigurationDocsAreGenerated(t *testing.T) {
	const path = "../../docs/configuration.md"
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := withSettings(page)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(page) {
		got, gen := strings.Split(string(page), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(got), len(gen)); i++ {
			g, w := "(end of file)", "(end of file)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(gen) {
				w = gen[i]
			}
			if g != w {
				t.Fatalf("docs/configuration.md differs from the flag table from line %d: run make docs\n have: %s\n want: %s", i+1, g, w)
			}
		}
	}
	// Every setting of every command has its row: the generator leaves no
	// group or command out.
	for _, build := range commandFlagSets {
		fs := build()
		for name := range fs.settings {
			if !strings.Contains(string(want), "| `--"+name+"` |") {
				t.Errorf("docs/configuration.md has no row for %s's --%s", fs.Name(), name)
			}
		}
	}
}

func TestMarkdownTextKeepsUsageReadable(t *testing.T) {
	for in, want := range map[string]string{
		"with --metrics-addr: serve /metrics":       "with `--metrics-addr`: serve /metrics",
		"implied by any other --kafka-tls-* flag":   "implied by any other `--kafka-tls-*` flag",
		"only with --source=poll, ce_* headers":     "only with `--source=poll`, ce_\\* headers",
		"the subject <topic>-key's schema | a list": "the subject \\<topic>-key's schema | a list",
	} {
		if got := markdownText(in); got != want {
			t.Errorf("markdownText(%q) = %q, want %q", in, got, want)
		}
	}
}
