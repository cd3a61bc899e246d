#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the test suite and print its URL.
# Usage: eval "$(.ci/start-postgres.sh)"   -> exports WORLDCTL_TEST_PG_URL
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$PGBIN" ] || { echo "no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }
PGDATA=${PGDATA:-/tmp/agentworlds-pg}
PGPORT=${PGPORT:-54329}
if ! id postgres >/dev/null 2>&1; then useradd --system --no-create-home postgres; fi
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  rm -rf "$PGDATA"; mkdir -p "$PGDATA"
  [ "$(id -u)" = 0 ] && chown postgres "$PGDATA"
  as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres -A trust --no-sync >/dev/null
fi
if ! as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
  as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w \
    -o "-p $PGPORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
fi
echo "export WORLDCTL_TEST_PG_URL=postgresql://postgres@127.0.0.1:$PGPORT/postgres"
