# Sourced by the scripts that drive the built server from outside (schemathesis, the
# generated client, the browser test): start_server serves target/debug/plantstore on a
# free port for a database URL, with a token and seeded plants; stop_server stops it.
# The script that sources it owns $work (a temporary folder) and calls stop_server on exit.

bin=target/debug/plantstore
server=""
[ -x "$bin" ] || { echo "$0: $bin is missing; run cargo test first" >&2; exit 1; }

# start_server NAME DATABASE_URL PLANTS: sets $port, $base and $token; logs to $work/NAME.log.
start_server() {
  local name="$1" url="$2" plants="$3"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  base="http://127.0.0.1:$port"
  # `seed` makes the database when there is none; `token create` needs one there.
  "$bin" --database-url "$url" seed --count "$plants" >/dev/null
  token="$("$bin" --database-url "$url" token create --name "$name" | tail -n1)"
  RUST_LOG=warn "$bin" --database-url "$url" serve --listen "127.0.0.1:$port" \
    >/dev/null 2>"$work/$name.log" &
  server=$!
  for _ in $(seq 100); do
    curl -fs "$base/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "$0: the server on $url never became ready" >&2
  cat "$work/$name.log" >&2
  exit 1
}

stop_server() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    server=""
  fi
  return 0
}
