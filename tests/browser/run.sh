#!/usr/bin/env bash
# Swagger UI in a real browser: Debian's Chromium, driven by playwright-core (npm, pinned
# in package-lock.json; it downloads no browser), against the built server on SQLite.
# Screenshots go to target/browser-shots. Needs target/debug/plantstore (`cargo test`
# builds it) and /usr/bin/chromium (.ci/run installs it). Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."

command -v "${CHROMIUM:-/usr/bin/chromium}" >/dev/null ||
  { echo "browser test: no Chromium at ${CHROMIUM:-/usr/bin/chromium}" >&2; exit 1; }
work="$(mktemp -d)"
source tests/peer/server.sh
trap 'stop_server; rm -rf "$work"' EXIT
(cd tests/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent)

shots=target/browser-shots
rm -rf "$shots" && mkdir -p "$shots"
db="$work/browser.db"
plant=7 keyed_plant=8 key=swagger-retry-1
start_server swagger-ui "sqlite://$db?mode=rwc" 10
BASE="$base" TOKEN="$token" PLANT="$plant" KEYED_PLANT="$keyed_plant" KEY="$key" SHOTS="$shots" \
  node tests/browser/swagger.mjs

# What the page showed, the database must hold: plants 7 and 8 gone with one audit row
# each naming the token (8's with the key), every other plant still there.
python3 - "$db" "$plant" "$keyed_plant" "$key" <<'PY'
import sqlite3, sys
db, plant, keyed, key = sqlite3.connect(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
left = {row[0] for row in db.execute("SELECT id FROM plants")}
audit = lambda p: db.execute(
    "SELECT token_name, idempotency_key FROM plantstore_deletions WHERE plant_id = ?", (p,)).fetchall()
assert left == set(range(1, 11)) - {plant, keyed}, left
assert audit(plant) == [("swagger-ui", None)], audit(plant)
assert audit(keyed) == [("swagger-ui", key)], audit(keyed)
print(f"ok: plants {plant} and {keyed} deleted through Swagger UI, audited once each for 'swagger-ui'"
      f" ({keyed} with key {key!r}); the others kept")
PY
echo "browser test passed; screenshots in $shots"
