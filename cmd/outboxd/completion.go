package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// cmdCompletion prints a shell completion script for bash or zsh:
//
//	source <(outboxd completion bash)
//	outboxd completion zsh > "${fpath[1]}/_outboxd"
//
// It completes the commands, the slot and config subcommands, the flags of
// every command, and the values of the flags whose table entry lists them.
func cmdCompletion(w io.Writer, args []string) error {
	if len(args) != 1 {
		return usageErrorf("completion needs a shell: bash or zsh")
	}
	var flags []string
	var bashValues, zshValues strings.Builder
	for _, name := range settingNames() {
		flags = append(flags, "--"+name)
		if v := allSettings()[name].values; len(v) > 0 {
			fmt.Fprintf(&bashValues, "\t--%s) values=%q ;;\n", name, strings.Join(v, " "))
			fmt.Fprintf(&zshValues, "\t\t--%s) compadd -- %s ;;\n", name, strings.Join(v, " "))
		}
	}
	cmds := strings.Join(append(slices.Clone(commandNames), "completion"), " ")
	switch args[0] {
	case "bash":
		_, err := fmt.Fprintf(w, `# bash completion for outboxd: source <(outboxd completion bash)
_outboxd_values() {
	local values
	case $1 in
%s	esac
	echo "$values"
}
_outboxd() {
	local cur=${COMP_WORDS[COMP_CWORD]} values
	if [[ $COMP_CWORD -eq 1 ]]; then
		mapfile -t COMPREPLY < <(compgen -W %q -- "$cur")
	elif [[ $COMP_CWORD -eq 2 && ${COMP_WORDS[1]} == slot ]]; then
		mapfile -t COMPREPLY < <(compgen -W "create drop status" -- "$cur")
	elif [[ $COMP_CWORD -eq 2 && ${COMP_WORDS[1]} == config ]]; then
		mapfile -t COMPREPLY < <(compgen -W "check" -- "$cur")
	elif [[ $COMP_CWORD -eq 2 && ${COMP_WORDS[1]} == completion ]]; then
		mapfile -t COMPREPLY < <(compgen -W "bash zsh" -- "$cur")
	elif [[ $cur == -* ]]; then
		mapfile -t COMPREPLY < <(compgen -W %q -- "$cur")
	elif values=$(_outboxd_values "${COMP_WORDS[COMP_CWORD-1]}") && [[ -n $values ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$values" -- "$cur")
	fi
}
complete -o default -F _outboxd outboxd
`, bashValues.String(), cmds, strings.Join(flags, " "))
		return err
	case "zsh":
		_, err := fmt.Fprintf(w, `#compdef outboxd
# zsh completion for outboxd: outboxd completion zsh > "${fpath[1]}/_outboxd"
_outboxd() {
	if (( CURRENT == 2 )); then
		compadd -- %s
	elif (( CURRENT == 3 )) && [[ $words[2] == slot ]]; then
		compadd -- create drop status
	elif (( CURRENT == 3 )) && [[ $words[2] == config ]]; then
		compadd -- check
	elif (( CURRENT == 3 )) && [[ $words[2] == completion ]]; then
		compadd -- bash zsh
	elif [[ $PREFIX == -* ]]; then
		compadd -- %s
	else
		case $words[CURRENT-1] in
%s		*) _files ;;
		esac
	fi
}
compdef _outboxd outboxd
`, cmds, strings.Join(flags, " "), zshValues.String())
		return err
	}
	return usageErrorf("completion: unknown shell %q: use bash or zsh", args[0])
}
