#!/usr/bin/env bash
# Local stand-ins for the base images the Dockerfile and docker-compose.yml name, built
# only where `docker pull` fails: CI's machines reach package registries but no image
# registry. A user's machine pulls the real images and never runs this. Each stand-in is
# built under the real image's name and tag, so the Dockerfile and the compose file are
# used exactly as a user has them:
# - debian:bookworm-slim      Debian bookworm from `debootstrap --variant=minbase`;
# - rust:1.95-slim-bookworm   that, plus gcc, libc6-dev, ca-certificates, this machine's
#                             own Rust toolchain (no other can be fetched here) and its CA
#                             bundle, so cargo inside a build reaches the crate registry;
# - postgres:15-alpine        that, plus Debian's postgresql-15 behind an entrypoint with the
#                             official image's contract: POSTGRES_USER, POSTGRES_PASSWORD,
#                             POSTGRES_DB, PGDATA (default /var/lib/postgresql/data),
#                             pg_isready on the PATH, SIGINT to stop.
# Run by tests/docker/compose.sh. Needs docker and debootstrap.
set -euo pipefail

DEBIAN=debian:bookworm-slim
RUST=rust:1.95-slim-bookworm
POSTGRES=postgres:15-alpine
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# present NAME: the image is here already, or a pull brought it.
present() {
  docker image inspect "$1" >/dev/null 2>&1 && { echo "$1: present"; return 0; }
  if timeout 60 docker pull -q "$1" >/dev/null 2>&1; then
    echo "$1: pulled"
    return 0
  fi
  echo "$1: no registry answered; building a local stand-in"
  return 1
}

build_debian() {
  local root="$work/rootfs"
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; echo "debootstrap failed" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$DEBIAN" >/dev/null
  rm -rf "$root"
}

build_rust() {
  local context="$work/rust" sysroot
  sysroot="$(rustc --print sysroot)"
  mkdir -p "$context/toolchain"
  # The compiler and the standard library; not the documentation.
  cp -a "$sysroot/bin" "$sysroot/lib" "$context/toolchain/"
  [ -d "$sysroot/libexec" ] && cp -a "$sysroot/libexec" "$context/toolchain/"
  cp /etc/ssl/certs/ca-certificates.crt "$context/host-ca-certificates.crt"
  cat >"$context/Dockerfile" <<EOF
FROM $DEBIAN
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      gcc libc6-dev ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
COPY toolchain /usr/local/rust
COPY host-ca-certificates.crt /usr/local/share/ca-certificates/host-ca-certificates.crt
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN cat /usr/local/share/ca-certificates/host-ca-certificates.crt >> /etc/ssl/certs/ca-certificates.crt \\
    && mkdir -p /usr/local/cargo/bin \\
    && for tool in cargo rustc rustdoc; do ln -s /usr/local/rust/bin/\$tool /usr/local/cargo/bin/\$tool; done \\
    && cargo --version && rustc --version
EOF
  docker build -q -t "$RUST" "$context" >/dev/null
}

build_postgres() {
  local context="$work/postgres"
  mkdir -p "$context"
  cat >"$context/entrypoint.sh" <<'EOF'
#!/bin/bash
# The official postgres image's environment contract, on Debian's PostgreSQL 15.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA
bin=/usr/lib/postgresql/15/bin
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "POSTGRES_PASSWORD must be set" >&2; exit 1; }
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -q \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "initialised $PGDATA for $POSTGRES_USER, database $POSTGRES_DB"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' \
  -c unix_socket_directories=/var/run/postgresql "$@"
EOF
  cat >"$context/Dockerfile" <<EOF
FROM $DEBIAN
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      postgresql-15 \\
    && rm -rf /var/lib/apt/lists/*
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh
ENV PGDATA=/var/lib/postgresql/data
VOLUME /var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
EOF
  docker build -q -t "$POSTGRES" "$context" >/dev/null
}

started=$SECONDS
present "$DEBIAN" || build_debian
present "$RUST" || build_rust
present "$POSTGRES" || build_postgres
echo "base images ready in $((SECONDS - started)) s"
