#!/usr/bin/env bash
# The peer's suite: schemathesis (from PyPI) runs every one of its checks against the
# running server's own /openapi.json, with a valid token, on SQLite and on PostgreSQL, and
# fails unless each backend got at least 1,000 generated cases and none failed.
# Needs target/debug/plantstore (`cargo test` builds it) and the PostgreSQL server of
# PLANTSTORE_TEST_POSTGRES_URL. Run by .ci/run after `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=target/debug/plantstore
venv="${SCHEMATHESIS_VENV:-target/schemathesis-venv}"
admin="${PLANTSTORE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
min_cases=1000
[ -x "$bin" ] || { echo "schemathesis: $bin is missing; run cargo test first" >&2; exit 1; }
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'schemathesis==4.32.5'
fi

work="$(mktemp -d)"
pg_db="plantstore_schemathesis_$$"
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  psql "$admin" -qAt -c "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql "$admin" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $pg_db"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

check_backend() {
  local name="$1" url="$2" port token generated
  port="$(free_port)"
  token="$("$bin" --database-url "$url" token create --name schemathesis | tail -n1)"
  "$bin" --database-url "$url" seed --count 100 >/dev/null
  RUST_LOG=warn "$bin" --database-url "$url" serve --listen "127.0.0.1:$port" \
    >/dev/null 2>"$work/$name.log" &
  server=$!
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.1
  done
  echo "== schemathesis on $name"
  "$venv/bin/st" run "http://127.0.0.1:$port/openapi.json" \
    -H "Authorization: Bearer $token" --checks all -n "$min_cases" --no-shrink \
    | tee "$work/$name.out"
  generated="$(grep -oE '[0-9]+ generated' "$work/$name.out" | grep -oE '[0-9]+' || echo 0)"
  [ "$generated" -ge "$min_cases" ] ||
    { echo "schemathesis on $name: only $generated cases generated, $min_cases promised" >&2; exit 1; }
  kill "$server" && wait "$server" 2>/dev/null || true
  server=""
  echo "schemathesis on $name: $generated cases, no failures"
}

check_backend sqlite "sqlite://$work/schemathesis.db?mode=rwc"
check_backend postgres "${admin%/*}/$pg_db"
