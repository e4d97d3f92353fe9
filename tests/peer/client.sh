#!/usr/bin/env bash
# A client generated from the served document by a well-known generator
# (openapi-python-client, from PyPI) deletes a plant, reads the 404 and 401 Error bodies
# as its own typed model, and the SQLite file shows the deletion. Needs
# target/debug/plantstore (`cargo test` builds it). Run by .ci/run after `cargo test`;
# `--install-only` installs the generator and stops (.ci/run does that early, beside the
# compiles).
set -euo pipefail
cd "$(dirname "$0")/../.."

venv="${CLIENT_VENV:-target/client-venv}"
if [ ! -x "$venv/bin/openapi-python-client" ] || [ ! -x "$venv/bin/ruff" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'openapi-python-client==0.29.1' 'ruff==0.17.6'
fi
[ "${1:-}" != --install-only ] || exit 0
work="$(mktemp -d)"
source tests/peer/server.sh
trap 'stop_server; rm -rf "$work"' EXIT

db="$work/client.db"
start_server generated-client "sqlite://$db?mode=rwc" 2

curl -fs "$base/openapi.json" -o "$work/openapi.json"
venv_bin="$(cd "$venv/bin" && pwd)"
# The generator formats its output with ruff, which it finds on PATH.
PATH="$venv_bin:$PATH" openapi-python-client generate --path "$work/openapi.json" \
  --output-path "$work/generated" --fail-on-warning
PYTHONPATH="$work/generated" BASE="$base" \
  TOKEN="$token" DB="$db" "$venv/bin/python" - <<'PY'
import os, sqlite3
from plant_store_client import AuthenticatedClient, Client
from plant_store_client.api.plants import delete_plant
from plant_store_client.models import Error

base, token = os.environ["BASE"], os.environ["TOKEN"]
client = AuthenticatedClient(base_url=base, token=token)

deleted = delete_plant.sync_detailed(client=client, id=1)
assert deleted.status_code == 204, deleted
again = delete_plant.sync_detailed(client=client, id=1)
assert again.status_code == 404 and isinstance(again.parsed, Error), again
assert again.parsed.error == 404 and again.parsed.message == "No plant with id 1 exists.", again.parsed
anonymous = delete_plant.sync_detailed(client=Client(base_url=base), id=2)
assert anonymous.status_code == 401 and isinstance(anonymous.parsed, Error), anonymous
assert anonymous.parsed.error == 401, anonymous.parsed

rows = dict(sqlite3.connect(os.environ["DB"]).execute("SELECT id, 1 FROM plants").fetchall())
assert 1 not in rows and 2 in rows, rows
print("generated client: 204, then 404 and 401 as Error models; plant 1 gone, plant 2 kept")
PY
