# tollgate container image: a cached dependency layer, a release build, and a small
# distroless runtime (glibc, CA certificates, no shell) running as a non-root user.
# Expected size: about 40 MB (distroless cc ~ 24 MB + the tollgate binary ~ 15 MB).

FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first: this layer is rebuilt only when Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/hot_path.rs \
    && cargo build --release --locked --bin tollgate \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin tollgate \
    && strip target/release/tollgate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tollgate /usr/local/bin/tollgate
COPY deploy/container/tollgate.toml /etc/tollgate/tollgate.toml
ENV TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml
USER nonroot:nonroot
# 8080: the proxy; 9090: the admin listener (/metrics, /healthz, /readyz, /limits), on all of
# the container's addresses (deploy/container/tollgate.toml): publish it only to a private
# network.
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/tollgate", "health"]
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["run", "--config", "/etc/tollgate/tollgate.toml"]
