#!/bin/sh
# Runs once at initdb time in the postgres:17 container (docker-compose.yml).
# The image's pg_hba.conf admits "all" databases from any host, but the
# replication pseudo-database needs its own line: without it outboxd's
# replication connection from the host is refused.
set -eu
echo "host replication all all trust" >>"$PGDATA/pg_hba.conf"
