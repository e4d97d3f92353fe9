# The image `docker compose up --build` builds: cargo-chef's layout (as zero-to-production
# has it), so the dependencies build in a layer of their own that stays cached until
# Cargo.lock or a manifest changes, and the whole build context is copied (`COPY . .`
# behind .dockerignore), so a new workspace member needs no change here. Release build
# from the committed sqlx offline data: no database at build time.
FROM rust:1.95-slim-bookworm AS chef
WORKDIR /src
ENV SQLX_OFFLINE=true CARGO_TERM_COLOR=never
# cargo-chef only reads manifests and runs cargo, and stays out of the final image: an
# unoptimised build of it compiles in about half the time of a release one.
RUN cargo install cargo-chef --version 0.1.78 --locked --debug

# The recipe: every workspace member's manifest, with the sources left out.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin plantstore
COPY . .
RUN cargo build --release --locked --bin plantstore

# Run: a slim base, the one binary, a non-root user. PostgreSQL's TLS roots are built into
# the binary; webhook deliveries and a JWKS URL use the system's, copied from the build stage
# (the slim base has none).
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data --create-home plantstore
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /src/target/release/plantstore /usr/local/bin/plantstore
USER plantstore:plantstore
WORKDIR /data
ENV PLANTSTORE_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/plantstore.db?mode=rwc
EXPOSE 8080
VOLUME ["/data"]
# bash's /dev/tcp: the image needs no curl for its own health check. It probes the port
# /readyz is served on: PLANTSTORE_ADMIN_LISTEN's when set, else PLANTSTORE_LISTEN's.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "addr=${PLANTSTORE_ADMIN_LISTEN:-$PLANTSTORE_LISTEN} && exec 3<>/dev/tcp/127.0.0.1/${addr##*:} && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["plantstore"]
CMD ["serve"]
