#!/usr/bin/env bash
# The peer's suite: schemathesis (from PyPI) runs every one of its checks against the
# running server's own /openapi.json, with a valid token, on SQLite and on PostgreSQL, and
# fails unless each backend got at least 1,000 generated cases and none failed.
# Needs target/debug/plantstore (`cargo test` builds it) and the PostgreSQL server of
# PLANTSTORE_TEST_POSTGRES_URL. Run by .ci/run after `cargo test`; `--install-only`
# installs schemathesis and stops (.ci/run does that early, beside the compiles).
set -euo pipefail
cd "$(dirname "$0")/../.."

venv="${SCHEMATHESIS_VENV:-target/schemathesis-venv}"
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'schemathesis==4.32.5'
fi
[ "${1:-}" != --install-only ] || exit 0
admin="${PLANTSTORE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
min_cases=1000
work="$(mktemp -d)"
source tests/peer/server.sh

pg_db="plantstore_schemathesis_$$"
cleanup() {
  stop_server
  psql "$admin" -qAt -c "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql "$admin" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $pg_db"

check_backend() {
  local name="$1" url="$2" generated
  start_server "schemathesis-$name" "$url" 100
  echo "== schemathesis on $name"
  "$venv/bin/st" --config-file tests/peer/schemathesis.toml run "$base/openapi.json" \
    -H "Authorization: Bearer $token" --checks all -n "$min_cases" --no-shrink \
    | tee "$work/$name.out"
  generated="$(grep -oE '[0-9]+ generated' "$work/$name.out" | grep -oE '[0-9]+' || echo 0)"
  [ "$generated" -ge "$min_cases" ] ||
    { echo "schemathesis on $name: only $generated cases generated, $min_cases promised" >&2; exit 1; }
  stop_server
  echo "schemathesis on $name: $generated cases, no failures"
}

check_backend sqlite "sqlite://$work/schemathesis.db?mode=rwc"
check_backend postgres "${admin%/*}/$pg_db"
