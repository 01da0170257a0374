# outboxd developer entry points. The dev stack (PostgreSQL + Kafka as plain
# local processes) is managed by dev/stack; see `dev/stack help`.

SHELL := /bin/bash
GO    ?= go
STACK := dev/stack

.PHONY: all build deps up down test demo

all: build

## build: compile the binaries under cmd/ into bin/
build:
	$(GO) build -o bin/ ./cmd/...

## deps: install apt packages if missing, fetch the Kafka jars and Go modules
deps:
	$(STACK) deps
	$(GO) mod download

## up: start the dev stack (idempotent) and write .devstack.env
up:
	$(STACK) up

## down: stop the dev stack and remove its data
down:
	$(STACK) down

## test: vet and run every test against a fresh dev stack. The stack is taken
## down on every exit path (the EXIT trap), and make still fails when vet or a
## test fails: bash exits with the failing command's status after the trap.
test: deps
	@set -euo pipefail; \
	trap '$(STACK) down' EXIT; \
	$(STACK) up; \
	set -a; source ./.devstack.env; set +a; \
	echo "go vet ./..."; $(GO) vet ./...; \
	echo "go test -race -count=1 -timeout 20m ./..."; \
	$(GO) test -race -count=1 -timeout 20m ./...

demo:
	@echo "make demo: not yet — lands with the demo issue"
