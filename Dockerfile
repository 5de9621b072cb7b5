# Sendium as a single-process container: `docker build -t sendium .` (or `just image`).
#
#   docker run -e SENDIUM__ADMIN__TOKEN=… -v sendium-data:/var/lib/sendium \
#              -v ./sendium.toml:/etc/sendium/sendium.toml:ro -p 2775:2775 -p 8080:8080 -p 9090:9090 sendium
#
# The configuration is /etc/sendium/sendium.toml (the image ships deploy/sendium.toml
# there: durable file stages in /var/lib/sendium, listeners on 0.0.0.0, the admin token
# required); the data directory is the volume /var/lib/sendium.

FROM rust:1-slim-bookworm AS build
# Passed in by the builder (`--build-arg SENDIUM_GIT_COMMIT=$(git rev-parse --short=12 HEAD)`):
# the build context has no .git, and `sendium --version` shows it.
ARG SENDIUM_GIT_COMMIT=unknown
ENV SENDIUM_GIT_COMMIT=${SENDIUM_GIT_COMMIT}
# make builds jemalloc, the gateway's allocator; the image has the C compiler already.
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sendium-ops --bin sendium \
 && install -m 0755 target/release/sendium /usr/local/bin/sendium

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/sendium --shell /usr/sbin/nologin sendium \
 && mkdir -p /etc/sendium /var/lib/sendium \
 && chown sendium:sendium /var/lib/sendium
COPY --from=build /usr/local/bin/sendium /usr/local/bin/sendium
COPY deploy/sendium.toml /etc/sendium/sendium.toml
USER sendium
VOLUME ["/var/lib/sendium"]
# SMPP, HTTP submissions, admin (health, readiness, metrics).
EXPOSE 2775 8080 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["sendium", "healthcheck", "--addr", "127.0.0.1:9090"]
ENTRYPOINT ["sendium"]
CMD ["serve", "--config", "/etc/sendium/sendium.toml"]
