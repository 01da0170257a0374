# shellcheck shell=bash
# dev/stack's tool checks: lint-deps and deploy-check.
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

cmd_lint_deps() {
	command -v shellcheck >/dev/null || apt_install shellcheck
}

# The tools deploy/ is checked with, the ones its users run: Prometheus's
# promtool (a Go module, built once into .cache/bin) for the alert rules, and
# kubernetes-validate (PyPI; it ships the Kubernetes JSON schemas, which
# kubeconform would fetch from GitHub, out of reach here) for the manifests.
cmd_deploy_check() {
	local bin="$ROOT/.cache/bin" venv="$ROOT/.cache/kube-validate-$KUBE_VALIDATE_VERSION"
	mkdir -p "$bin"
	if [[ ! -x $bin/promtool-$PROMTOOL_VERSION ]]; then
		log "building promtool $PROMTOOL_VERSION (once; a few minutes)"
		GOBIN="$bin" go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
		mv "$bin/promtool" "$bin/promtool-$PROMTOOL_VERSION"
	fi
	if [[ ! -x $venv/bin/kubernetes-validate ]]; then
		log "installing kubernetes-validate $KUBE_VALIDATE_VERSION (once)"
		command -v python3 >/dev/null || apt_install python3
		python3 -m venv "$venv" || { apt_install python3-venv && python3 -m venv "$venv"; }
		"$venv/bin/pip" install -q "kubernetes-validate==$KUBE_VALIDATE_VERSION"
	fi
	(cd "$ROOT/deploy/prometheus" &&
		"$bin/promtool-$PROMTOOL_VERSION" check rules alerts.yml &&
		"$bin/promtool-$PROMTOOL_VERSION" test rules alerts_test.yml)
	# Kustomization and ServiceMonitor have no schema among Kubernetes' own:
	# checked as YAML by the Go test deploy_test.go.
	local f files=()
	for f in "$ROOT"/deploy/kubernetes/*.yaml; do
		case $(basename "$f") in kustomization.yaml | servicemonitor.yaml) ;; *) files+=("$f") ;; esac
	done
	"$venv/bin/kubernetes-validate" --strict --quiet -k 1.31.0 "${files[@]}"
	"$venv/bin/kubernetes-validate" --strict --quiet -k 1.34.0 "${files[@]}"
	local unit="skipped (no systemd-analyze here)"
	if command -v systemd-analyze >/dev/null; then
		deploy_check_unit
		unit="systemd-analyze verify clean"
	else
		log "deploy-check: systemd-analyze not found, outboxd.service not verified (Debian package systemd)"
	fi
	log "deploy ok: alert rules (promtool check + test), ${#files[@]} manifests (Kubernetes 1.31 and 1.34, strict), outboxd.service $unit"
}

# deploy_check_unit runs systemd-analyze verify on deploy/outboxd.service.
# verify refuses a unit whose ExecStart binary is missing, and outboxd is not
# installed in /usr/local/bin here: a copy of the unit points at a stub
# instead. verify exits 0 on an unknown key or a value it cannot parse (it
# warns and ignores the line), so any output at all is a failure.
deploy_check_unit() {
	local tmp out
	tmp=$(mktemp -d)
	printf '#!/bin/sh\n' >"$tmp/outboxd" && chmod +x "$tmp/outboxd"
	sed "s|/usr/local/bin/outboxd|$tmp/outboxd|g" "$ROOT/deploy/outboxd.service" >"$tmp/outboxd.service"
	out=$(systemd-analyze verify "$tmp/outboxd.service" 2>&1) || out+=$'\n'"systemd-analyze verify failed"
	rm -rf "$tmp"
	if [[ -n $out ]]; then
		printf '%s\n' "$out" >&2
		die "deploy/outboxd.service: systemd-analyze verify"
	fi
}
