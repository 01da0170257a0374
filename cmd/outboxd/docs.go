package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// docs/configuration.md lists the settings between these markers; what lies
// between them is generated from the flag table (make docs), the prose
// around them is written by hand.
const (
	settingsBegin = "<!-- settings: generated from the flag table by `make docs`; change the flags' declarations in cmd/outboxd, not this text -->"
	settingsEnd   = "<!-- end of the generated settings -->"
)

// cmdDocs is the hidden "outboxd docs FILE": it rewrites the generated
// settings of FILE (docs/configuration.md) in place.
func cmdDocs(args []string) error {
	if len(args) != 1 {
		return usageErrorf("docs needs the file to update: docs/configuration.md")
	}
	page, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	out, err := withSettings(page)
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	if bytes.Equal(out, page) {
		return nil
	}
	return os.WriteFile(args[0], out, 0o644)
}

// withSettings returns page with the text between its markers generated
// anew.
func withSettings(page []byte) ([]byte, error) {
	begin := bytes.Index(page, []byte(settingsBegin))
	end := bytes.Index(page, []byte(settingsEnd))
	if begin < 0 || end < begin {
		return nil, errors.New("no generated settings: want the lines " + settingsBegin + " and " + settingsEnd)
	}
	var out bytes.Buffer
	out.Write(page[:begin+len(settingsBegin)])
	out.WriteString("\n\n")
	out.WriteString(settingsMarkdown())
	out.WriteString("\n")
	out.Write(page[end:])
	return out.Bytes(), nil
}

// settingsMarkdown is one table per group of run's settings, then one per
// command with settings of its own.
func settingsMarkdown() string {
	var b strings.Builder
	run := runFlags(new(options))
	byGroup := make([][]*flag.Flag, len(helpGroups))
	run.VisitAll(func(f *flag.Flag) {
		g := run.setting(f.Name).group
		byGroup[g] = append(byGroup[g], f)
	})
	for g, flags := range byGroup {
		if len(flags) == 0 {
			continue
		}
		fmt.Fprintf(&b, "**%s**", helpGroups[g])
		if d := groupDocs[group(g)]; d != "" {
			fmt.Fprintf(&b, " (%s)", d)
		}
		b.WriteString("\n\n| flag | default | what it does |\n|---|---|---|\n")
		for _, f := range flags { // VisitAll's order: by name
			writeSettingRow(&b, run, f)
		}
		b.WriteString("\n")
	}
	b.WriteString("**The other commands' own settings** (besides run's, or the PostgreSQL connection and slot settings and `--log-level`, `--log-json`, `--config`)\n\n")
	common := newFlagSet("", new(options))
	for _, build := range commandFlagSets {
		fs := build()
		if fs.Name() == run.Name() {
			continue
		}
		// The commands that publish, or read what run publishes, take
		// all of run's settings; the others the common ones.
		base, also := common, ""
		if fs.Lookup("delivery") != nil {
			base, also = run, " (and all of run's)"
		}
		var own []*flag.Flag
		fs.VisitAll(func(f *flag.Flag) {
			if base.Lookup(f.Name) == nil {
				own = append(own, f)
			}
		})
		if len(own) == 0 {
			continue
		}
		fmt.Fprintf(&b, "`%s`%s\n\n| flag | default | what it does |\n|---|---|---|\n", fs.Name(), also)
		for _, f := range own {
			writeSettingRow(&b, fs, f)
		}
		b.WriteString("\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func writeSettingRow(b *strings.Builder, fs *flagSet, f *flag.Flag) {
	s := fs.setting(f.Name)
	def := " "
	if f.DefValue != "" {
		def = " `" + f.DefValue + "` "
	}
	text := s.doc
	if text == "" {
		text = markdownText(f.Usage)
	}
	switch {
	case s.secret && s.redact != nil:
		text += "; printed with its password redacted, never quoted in an error"
	case s.secret:
		text += "; a secret: never printed, nor quoted in an error"
	}
	if s.cliOnly {
		text += "; not a key of the `--config` file"
	}
	fmt.Fprintf(b, "| `--%s` |%s| %s |\n", f.Name, def, strings.ReplaceAll(text, "|", `\|`))
}

// A flag in a usage line, with a value (--source=poll) or as a family
// (--kafka-tls-*).
var flagInText = regexp.MustCompile(`--[a-z](?:[a-z0-9-]*[a-z0-9])?(?:-\*|=[a-z0-9-]+)?`)

// markdownText is a usage line as Markdown: flags as code, and what
// Markdown would take for markup escaped.
func markdownText(usage string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `<`, `\<`, "`", "\\`")
	var b strings.Builder
	last := 0
	for _, m := range flagInText.FindAllStringIndex(usage, -1) {
		b.WriteString(r.Replace(usage[last:m[0]]))
		b.WriteString("`" + usage[m[0]:m[1]] + "`")
		last = m[1]
	}
	b.WriteString(r.Replace(usage[last:]))
	return b.String()
}
