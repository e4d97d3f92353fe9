#!/usr/bin/env bash
# Prometheus's own tools on what the service ships: promtool (from Debian's prometheus
# package, unpacked into target/ where it is not installed) checks /metrics after a few
# requests have filled every series, then checks the alert rules in deploy/prometheus and
# runs their unit tests. Needs target/debug/plantstore. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."

promtool="$(command -v promtool || true)"
if [ -z "$promtool" ]; then
  promtool=target/prometheus/usr/bin/promtool
  if [ ! -x "$promtool" ]; then
    rm -rf target/prometheus && mkdir -p target/prometheus
    (cd target/prometheus &&
      { apt-get download -qq prometheus 2>/dev/null ||
        { apt-get update -qq && apt-get download -qq prometheus 2>/dev/null; }; } &&
      dpkg -x prometheus_*.deb .)
  fi
fi
work="$(mktemp -d)"
source tests/peer/server.sh
trap 'stop_server; rm -rf "$work"' EXIT
start_server promtool "sqlite://$work/promtool.db?mode=rwc" 2
curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $token" "$base/plants/1"
curl -s -o /dev/null -X DELETE "$base/plants/2"
curl -fs "$base/metrics" -o "$work/metrics.txt"
"$promtool" check metrics <"$work/metrics.txt"
echo "promtool check metrics: no problems in $(grep -vc '^#' "$work/metrics.txt") series"
"$promtool" check rules deploy/prometheus/plantstore-rules.yml
# The test file names its rules relative to itself.
"$promtool" test rules deploy/prometheus/plantstore-rules.test.yml
