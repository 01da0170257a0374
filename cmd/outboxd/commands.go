package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// errUsage means the usage was already printed.
var errUsage = errors.New("usage")

const usage = `outboxd publishes transactional-outbox rows from PostgreSQL to Kafka.

Usage:
  outboxd run [flags]            stream outbox INSERTs from the slot to Kafka
  outboxd migrate [flags]        create the outbox table; --source=poll: also what polling needs
  outboxd slot create [flags]    create the publication and the replication slot
  outboxd slot drop [flags]      drop the replication slot (and, with --publication-too, the publication)
  outboxd slot status [flags]    show the slot, its lag and retained WAL
  outboxd status [flags]         health of the slot and publication; exit 1 on a problem (--json)
  outboxd replay [flags]         publish outbox rows again from the table (--since or --from-id),
                                 after a lost slot; --resume: then run, accepting the gap
  outboxd checkpoint reset --to-current-history [flags]
                                 after outboxd refused a database that went back in time
                                 (restore, PITR, failover): move the outbox id sequence past
                                 the highest id published and start the checkpoint over
  outboxd audit [flags]          proof of delivery: compare the rows of a range (--from-id or --since)
                                 with their Kafka records: missing, duplicated, reordered, mismatched;
                                 exit 0 clean, 1 on a verdict; --repair republishes the missing rows
  outboxd prune --older-than D   delete outbox rows older than D once (run --retention does it on a schedule)
  outboxd emit-key rotate [flags]
                                 rotate the key outbox_emit signs with (outbox_emit_rotate_key());
                                 --forget-old-keys: after it leaked
  outboxd config check [flags]   validate the run settings and print them, secrets redacted
  outboxd version                the version, commit and Go version of this binary
  outboxd completion bash|zsh    a shell completion script (source <(outboxd completion bash))
  outboxd help                   this text

Every flag can also be set as an environment variable: OUTBOXD_ and the flag's
name in upper case with - as _ (--pg-dsn is OUTBOXD_PG_DSN), or as a key of the
YAML file given by --config (pg-dsn: ...). Precedence: flag > env > file >
default. Run "outboxd <command> --help" for its flags.
`

func dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest)
	case "migrate":
		return cmdMigrate(ctx, rest)
	case "slot":
		if len(rest) == 0 {
			return usageErrorf("slot needs a subcommand: create, drop or status")
		}
		switch rest[0] {
		case "help", "-h", "--help":
			fmt.Fprint(os.Stdout, slotUsage)
			return nil
		case "create":
			return cmdSlotCreate(ctx, rest[1:])
		case "drop":
			return cmdSlotDrop(ctx, rest[1:])
		case "status":
			return cmdSlotStatus(ctx, rest[1:])
		}
		return usageErrorf("unknown slot subcommand %q%s: use create, drop or status", rest[0],
			didYouMean(rest[0], "create", "drop", "status"))
	case "status":
		return cmdStatus(ctx, rest)
	case "replay":
		return cmdReplay(ctx, rest)
	case "prune":
		return cmdPrune(ctx, rest)
	case "emit-key":
		if len(rest) == 0 || rest[0] != "rotate" {
			return usageErrorf("emit-key needs a subcommand: rotate")
		}
		return cmdEmitKeyRotate(ctx, rest[1:])
	case "audit":
		return cmdAudit(ctx, rest)
	case "checkpoint":
		if len(rest) == 0 || rest[0] != "reset" {
			return usageErrorf("checkpoint needs a subcommand: reset --to-current-history")
		}
		return cmdCheckpointReset(ctx, rest[1:])
	case "config":
		if len(rest) > 0 && (rest[0] == "help" || rest[0] == "-h" || rest[0] == "--help") {
			fmt.Fprint(os.Stdout, "Usage: outboxd config check [run flags]\n\nValidates the settings of outboxd run (flags, OUTBOXD_* environment, --config file)\nand prints them with the source of each value, secrets redacted.\nSee \"outboxd run --help\" for the flags.\n")
			return nil
		}
		if len(rest) == 0 || rest[0] != "check" {
			return usageErrorf("config needs a subcommand: check")
		}
		return cmdConfigCheck(ctx, rest[1:])
	case "help", "-h", "--help":
		if len(rest) > 0 && rest[0] != "help" {
			return dispatch(ctx, []string{rest[0], "--help"})
		}
		fmt.Fprint(os.Stdout, usage)
		return nil
	case "version", "--version", "-version":
		return cmdVersion(os.Stdout)
	case "completion":
		return cmdCompletion(os.Stdout, rest)
	case "docs":
		// Hidden: make docs regenerates configuration.md's settings.
		return cmdDocs(rest)
	}
	return usageErrorf("unknown command %q%s (commands: %s)", cmd, didYouMean(cmd, commandNames...), strings.Join(commandNames, ", "))
}

var commandNames = []string{"run", "migrate", "slot", "status", "replay", "audit", "prune", "emit-key", "checkpoint", "config", "version", "help"}

const slotUsage = `Usage:
  outboxd slot create [flags]    create the publication and the replication slot
  outboxd slot drop [flags]      drop the replication slot (and, with --publication-too, the publication)
  outboxd slot status [flags]    show the slot, its lag and retained WAL

Run "outboxd slot <subcommand> --help" for its flags.
`

// didYouMean returns " (did you mean X?)" for the name in names nearest to
// got, or "" when none is near.
func didYouMean(got string, names ...string) string {
	known := map[string]bool{}
	for _, n := range names {
		known[n] = true
	}
	if s := suggest(got, known); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}
