#!/usr/bin/env bash
# The deployment path as the README gives it, on this checkout: `docker compose up --build`
# (the compose plugin where the client has it, else docker-compose), the service's own
# health check, the initial token from the logs, admin commands through `exec`, the API on
# the published port, data kept across `down` + `up`, a clean `docker stop`; then the image
# alone on its embedded SQLite with a volume. Each step is printed; anything that did not
# run or answered wrong fails the script. Run by .ci/run, from the repository's root.
set -euo pipefail
cd "$(dirname "$0")/../.."

step() { printf -- '-- %s\n' "$*"; }
fail() { printf 'compose test FAILED: %s\n' "$*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

started=$SECONDS
step "base images (local stand-ins only where a pull fails)"
bash tests/docker/base-images.sh

if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  command -v docker-compose >/dev/null || fail "neither docker compose nor docker-compose is installed"
  compose_cmd=(docker-compose)
fi
project="plantstore-ci-$$"
PLANTSTORE_PORT="$(free_port)" PLANTSTORE_ADMIN_PORT="$(free_port)"
export PLANTSTORE_PORT PLANTSTORE_ADMIN_PORT
compose() { "${compose_cmd[@]}" -p "$project" "$@"; }
api="http://127.0.0.1:$PLANTSTORE_PORT"
alone="plantstore-alone-$$"
cleanup() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  docker rm -f "$alone" >/dev/null 2>&1 || true
  docker volume rm -f "$alone-data" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# wait_healthy CONTAINER: until its own HEALTHCHECK says healthy; prints how long it took.
wait_healthy() {
  local since=$SECONDS status=""
  for _ in $(seq 120); do
    status="$(docker inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null || true)"
    [ "$status" = healthy ] && { echo "$1 healthy after $((SECONDS - since)) s"; return 0; }
    sleep 1
  done
  docker logs "$1" 2>&1 | tail -20 >&2
  fail "$1 is not healthy after 120 s (health: ${status:-none})"
}

# expect STATUS METHOD URL [curl args…]: the answer's status must be STATUS; the body is
# left in $body.
expect() {
  local want="$1" method="$2" url="$3" got
  shift 3
  body="$(mktemp)"
  got="$(curl -s -o "$body" -w '%{http_code}' -X "$method" "$@" "$url")" || got="no answer"
  [ "$got" = "$want" ] || { cat "$body" >&2; fail "$method $url answered $got, expected $want"; }
  echo "$method ${url#"$api"} -> $got $(head -c 200 "$body")"
}

# The token printed on a first start: the line after "Created the first API token" on
# the service's stdout. Read from stdout alone: its log lines go to stderr, and a merged
# view can put one between the two lines (seen once in CI).
initial_token() { sed -n '/Created the first API token/{n;p;q}' | tr -d '\r' | awk '{print $NF}'; }

step "${compose_cmd[*]} up --build (project $project, API port $PLANTSTORE_PORT)"
built=$SECONDS
compose up --build -d
echo "built and started in $((SECONDS - built)) s"
service="$(compose ps -q plantstore)"
[ -n "$service" ] || fail "no plantstore container"
wait_healthy "$service"

step "the initial token from the logs"
token="$(docker logs "$service" 2>/dev/null | initial_token)"
[[ "$token" == pst_* ]] || fail "no initial token in the logs"
echo "initial token: ${token:0:12}…"

step "exec: seed and a second token"
compose exec -T plantstore plantstore seed --count 5
second="$(compose exec -T plantstore plantstore token create --name ci-second | tail -n1 | tr -d '\r')"
[[ "$second" == pst_* ]] || fail "token create printed no token"

step "the API through the published port"
expect 204 DELETE "$api/plants/1" -H "Authorization: Bearer $token"
expect 404 DELETE "$api/plants/1" -H "Authorization: Bearer $token"
grep -q '"error":404' "$body" || fail "the 404 is not the Error shape"
expect 401 DELETE "$api/plants/2"
grep -q '"error":401' "$body" || fail "the 401 is not the Error shape"
expect 204 DELETE "$api/plants/2" -H "Authorization: Bearer $second"
expect 200 GET "$api/docs"
grep -q swagger-ui "$body" || fail "/docs is not Swagger UI"
expect 200 GET "$api/openapi.json"
expect 404 GET "$api/readyz"
expect 200 GET "http://127.0.0.1:$PLANTSTORE_ADMIN_PORT/readyz"
expect 200 GET "http://127.0.0.1:$PLANTSTORE_ADMIN_PORT/metrics"
grep -q '^plantstore_deletions_total 2' "$body" || fail "/metrics does not count the 2 deletes"

step "down, then up again: deletes and tokens kept"
compose down
compose up -d
service="$(compose ps -q plantstore)"
wait_healthy "$service"
expect 404 DELETE "$api/plants/1" -H "Authorization: Bearer $token"
expect 204 DELETE "$api/plants/3" -H "Authorization: Bearer $second"
created="$(compose logs --no-color plantstore | grep -c 'Created the first API token' || true)"
[ "$created" = 0 ] || fail "the second start printed a new initial token"
echo "no new initial token on the second start"
probes="$(compose logs --no-color plantstore | grep -c 'path=/readyz' || true)"
[ "$probes" = 0 ] || fail "health checks are logged at info ($probes lines)"
echo "no health-check lines in the logs"

step "exec: deletions list names each caller"
listed="$(compose exec -T plantstore plantstore deletions list --json)"
python3 - "$listed" <<'PY'
import json, sys
entries = json.loads(sys.argv[1])
got = sorted((e["plant_id"], e["caller"]) for e in entries)
assert got == [(1, "initial"), (2, "ci-second"), (3, "ci-second")], got
print(f"deletions list: {got}")
PY

step "docker stop: exit 0 within the grace period"
stopping=$SECONDS
docker stop -t 15 "$service" >/dev/null
took=$((SECONDS - stopping))
code="$(docker inspect -f '{{.State.ExitCode}}' "$service")"
[ "$code" = 0 ] || fail "the service exited $code after docker stop"
[ "$took" -lt 15 ] || fail "docker stop took $took s: the grace period ran out"
echo "stopped in $took s, exit code 0"

step "down -v"
compose down -v
[ -z "$(docker volume ls -q --filter "name=${project}_pgdata")" ] || fail "the pgdata volume is left"

step "the image alone: the embedded SQLite in a volume"
image="$(docker images -q plantstore:1.0.0)"
[ -n "$image" ] || fail "compose built no plantstore:1.0.0 image"
port="$(free_port)"
run_alone() { docker run -d --name "$alone" -p "127.0.0.1:$port:8080" -v "$alone-data:/data" plantstore:1.0.0 >/dev/null; }
run_alone
wait_healthy "$alone"
alone_token="$(docker logs "$alone" 2>/dev/null | initial_token)"
[[ "$alone_token" == pst_* ]] || fail "no initial token in the container's logs"
docker exec "$alone" plantstore seed --count 3
api="http://127.0.0.1:$port"
expect 204 DELETE "$api/plants/2" -H "Authorization: Bearer $alone_token"
docker rm -f "$alone" >/dev/null
run_alone
wait_healthy "$alone"
expect 404 DELETE "$api/plants/2" -H "Authorization: Bearer $alone_token"
expect 204 DELETE "$api/plants/3" -H "Authorization: Bearer $alone_token"
echo "a new container on the same volume kept the delete and the token"

echo "compose test passed in $((SECONDS - started)) s"
