#!/usr/bin/env bash
# Swagger UI in a real browser, and a page on another origin calling the API with fetch:
# Debian's Chromium, driven by playwright-core (npm, pinned in package-lock.json; it
# downloads no browser), against the built server on SQLite with CORS on for one origin.
# Screenshots go to target/browser-shots. Needs target/debug/plantstore (`cargo test`
# builds it) and /usr/bin/chromium (.ci/run installs it). Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."

command -v "${CHROMIUM:-/usr/bin/chromium}" >/dev/null ||
  { echo "browser test: no Chromium at ${CHROMIUM:-/usr/bin/chromium}" >&2; exit 1; }
work="$(mktemp -d)"
source tests/peer/server.sh
pages=()
stop_pages() { for pid in "${pages[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap 'stop_server; stop_pages; rm -rf "$work"' EXIT
(cd tests/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent)

shots=target/browser-shots
rm -rf "$shots" && mkdir -p "$shots"
db="$work/browser.db"
plant=7 keyed_plant=8 key=swagger-retry-1 page_plant=9 blocked_plant=10
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Two static page servers: two origins, one of them allowed. Swagger UI, on the service's
# own origin, must keep working with CORS on.
allowed_page="http://127.0.0.1:$(free_port)" other_page="http://127.0.0.1:$(free_port)"
for origin in "$allowed_page" "$other_page"; do
  python3 -m http.server --bind 127.0.0.1 --directory tests/browser/pages "${origin##*:}" \
    >/dev/null 2>&1 &
  pages+=($!)
done
for origin in "$allowed_page" "$other_page"; do
  for _ in $(seq 50); do curl -fs "$origin/cross-origin.html" >/dev/null && break; sleep 0.1; done
done
export PLANTSTORE_CORS_ALLOWED_ORIGINS="$allowed_page"
start_server swagger-ui "sqlite://$db?mode=rwc" 10
unset PLANTSTORE_CORS_ALLOWED_ORIGINS
BASE="$base" TOKEN="$token" PLANT="$plant" KEYED_PLANT="$keyed_plant" KEY="$key" SHOTS="$shots" \
  node tests/browser/swagger.mjs
BASE="$base" TOKEN="$token" ALLOWED_PAGE="$allowed_page" OTHER_PAGE="$other_page" \
  ALLOWED_PLANT="$page_plant" OTHER_PLANT="$blocked_plant" SHOTS="$shots" \
  node tests/browser/cross_origin.mjs

# What the pages showed, the database must hold: plants 7, 8 and 9 gone with one audit row
# each naming the token (8's and 9's with their keys), every other plant, 10 included,
# still there.
python3 - "$db" "$plant" "$keyed_plant" "$key" "$page_plant" <<'PY'
import sqlite3, sys
db, plant, keyed, key = sqlite3.connect(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
page = int(sys.argv[5])
left = {row[0] for row in db.execute("SELECT id FROM plants")}
audit = lambda p: db.execute(
    "SELECT token_name, idempotency_key FROM plantstore_deletions WHERE plant_id = ?", (p,)).fetchall()
assert left == set(range(1, 11)) - {plant, keyed, page}, left
assert audit(plant) == [("swagger-ui", None)], audit(plant)
assert audit(keyed) == [("swagger-ui", key)], audit(keyed)
assert audit(page) == [("swagger-ui", f"page-{page}")], audit(page)
print(f"ok: plants {plant} and {keyed} deleted through Swagger UI, audited once each for 'swagger-ui'"
      f" ({keyed} with key {key!r}); {page} by the page on the allowed origin; the others kept")
PY
echo "browser test passed; screenshots in $shots"
