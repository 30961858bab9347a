# The tether image, as operators and their CI build it:
#   docker build -t registry.example.com/tether:0.1.0 .
# Runs as UID 65532 on distroless cc (glibc, CA certificates, no shell, no
# package manager). `scripts/image` builds the same layout without a
# registry, FROM scratch.

# The workspace's toolchain (Cargo.toml: rust-version).
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS builder
WORKDIR /src
COPY . .
# The downloaded crates and the compiled dependencies live in BuildKit cache
# mounts, so a source change rebuilds tether alone (and links the whole
# program optimized as one: Cargo.toml, profile dist). Without the default
# `demo` feature, the shipped binary links nothing from tests/.
RUN --mount=type=cache,target=/usr/local/cargo/registry,id=cargo-registry \
    --mount=type=cache,target=/src/target,id=tether-target \
    cargo build --profile dist --locked --no-default-features -p tether --bin tether \
    && strip --strip-all -o /tether target/dist/tether

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tether" \
      org.opencontainers.image.description="Keeps a multi-cluster Kubernetes controller attached to the remote apiservers it watches." \
      org.opencontainers.image.source="https://github.com/tether-rs/tether" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /tether /tether
USER 65532:65532
# The chart passes its own args; these match them, minus the log format: the
# config is a file in a mounted folder, since a file mounted alone (subPath)
# never sees an update.
ENTRYPOINT ["/tether"]
CMD ["run", "--config", "/etc/tether/config/config.yaml"]
