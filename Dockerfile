# syntax=docker/dockerfile:1
# Build: the same release build the README gives, from the committed sqlx offline data
# (no database needed at build time).
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
ENV SQLX_OFFLINE=true CARGO_TERM_COLOR=never
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY migrations migrations
COPY src src
RUN cargo build --release --locked --bin plantstore

# Run: a slim base, the one binary, a non-root user. TLS roots are built into the binary.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data --create-home plantstore
COPY --from=build /src/target/release/plantstore /usr/local/bin/plantstore
USER plantstore:plantstore
WORKDIR /data
ENV PLANTSTORE_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/plantstore.db?mode=rwc
EXPOSE 8080
VOLUME ["/data"]
# bash's /dev/tcp: the image needs no curl for its own health check.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["plantstore"]
CMD ["serve"]
