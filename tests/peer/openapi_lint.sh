#!/usr/bin/env bash
# The linters API teams run, on the document the server serves (`plantstore openapi`
# prints that very document; tests/api/contract.rs holds them equal): Redocly CLI's
# `recommended` ruleset and Spectral's `spectral:oas` (npm, pinned in
# tests/peer/api-linters/package-lock.json), and fails on any error or warning from either.
# Needs target/debug/plantstore (`cargo test` builds it) and Node.js 20.19 or later.
# Run by .ci/run after `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/../.."

linters=tests/peer/api-linters
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
  process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' ||
  { echo "API linters: Redocly CLI needs Node.js 20.19 or later; this is $(node -v)" >&2; exit 1; }
(cd "$linters" && npm ci --no-audit --no-fund --silent)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
target/debug/plantstore openapi >"$work/openapi.json"

echo "== Redocly CLI $("$linters/node_modules/.bin/redocly" --version), recommended"
# Its JSON report counts warnings, which alone would not fail it; its exit status is
# read from that report, and a report that is not there shows what Redocly said.
REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true "$linters/node_modules/.bin/redocly" \
  lint --extends recommended --format json "$work/openapi.json" \
  >"$work/redocly.json" 2>"$work/redocly.err" || true
python3 - "$work/redocly.json" "$work/redocly.err" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("redocly wrote no report:\n" + open(sys.argv[2]).read())
for problem in report["problems"]:
    print(f'{problem["severity"]}: {problem["ruleId"]}: {problem["message"]}')
totals = report["totals"]
print(f'redocly: {totals["errors"]} errors, {totals["warnings"]} warnings')
sys.exit(1 if totals["errors"] or totals["warnings"] else 0)
PY

echo "== Spectral $("$linters/node_modules/.bin/spectral" --version), spectral:oas"
"$linters/node_modules/.bin/spectral" lint --ruleset "$linters/spectral.yaml" \
  --fail-severity warn "$work/openapi.json"
echo "spectral: 0 errors, 0 warnings"
