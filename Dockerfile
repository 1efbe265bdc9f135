# The Flint image for Kubernetes: `flint` (executors, and every other role) and `flint-k8s` (a
# driver that runs in the cluster). Executor pods run `tini -- flint executor ...` (the pod spec
# sets the command), so the executor is not PID 1 and a kill -9 of it fails its pod.
#
#   docker build -t flint:dev .
#   kind load docker-image flint:dev        # or push it where the cluster pulls from
#
# Runs as nobody (65534) and writes nothing at run time (no home, no temporary files: the
# secret comes in $FLINT_SECRET), so pods can set readOnlyRootFilesystem (k8s/deploy/ does).
# Not built on this project's machines (docker cannot run there).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p flint-cli --bin flint -p flint-k8s --bin flint-k8s

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini procps ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/flint /src/target/release/flint-k8s /usr/local/bin/
ENV HOME=/nonexistent
WORKDIR /
USER 65534:65534
ENTRYPOINT ["tini", "--"]
CMD ["flint", "--help"]
