#!/usr/bin/env bash
# The linters API teams run, on the document the running server serves: Redocly CLI's
# `recommended` ruleset and Spectral's `spectral:oas` (both from npm, pinned), and fails on
# any error or warning from either. Needs target/debug/plantstore (`cargo test` builds it).
# Run by .ci/run after `cargo test`; `--install-only` installs the linters into
# target/api-linters and stops (.ci/run does that early, beside the compiles).
set -euo pipefail
cd "$(dirname "$0")/../.."

redocly_version=2.77.0 spectral_version=6.16.3
tools="${API_LINTERS:-target/api-linters}"
redocly="$tools/node_modules/.bin/redocly" spectral="$tools/node_modules/.bin/spectral"
if [ "$("$redocly" --version 2>/dev/null)" != "$redocly_version" ] ||
  [ "$("$spectral" --version 2>/dev/null)" != "$spectral_version" ]; then
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-save --no-audit --no-fund --silent \
    "@redocly/cli@$redocly_version" "@stoplight/spectral-cli@$spectral_version"
fi
[ "${1:-}" != --install-only ] || exit 0
work="$(mktemp -d)"
source tests/peer/server.sh
trap 'stop_server; rm -rf "$work"' EXIT

start_server openapi-lint "sqlite://$work/lint.db?mode=rwc" 1
curl -fs "$base/openapi.json" -o "$work/openapi.json"

echo "== Redocly CLI $redocly_version, recommended"
# Its JSON report counts warnings, which alone would not fail it.
REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true "$redocly" lint \
  --extends recommended --format json "$work/openapi.json" >"$work/redocly.json" 2>/dev/null ||
  true
python3 - "$work/redocly.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for problem in report["problems"]:
    print(f'{problem["severity"]}: {problem["ruleId"]}: {problem["message"]}')
totals = report["totals"]
print(f'redocly: {totals["errors"]} errors, {totals["warnings"]} warnings')
sys.exit(1 if totals["errors"] or totals["warnings"] else 0)
PY

echo "== Spectral $spectral_version, spectral:oas"
echo 'extends: ["spectral:oas"]' >"$work/spectral.yaml"
"$spectral" lint --ruleset "$work/spectral.yaml" --fail-severity warn "$work/openapi.json"
echo "spectral: 0 errors, 0 warnings"
