# applistener image: a static binary on a distroless, non-root base.
#
#   docker build -t applistener --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#
# Releases do not need Docker: `make release` builds the same binary and the
# image (scratch, non-root 65532) with tools/release; see README.md "Install".
#   docker run --rm applistener serve -h
#
# Checked by deploy/helm/dockerfile_test.go (stages, CGO_ENABLED=0, base, USER,
# EXPOSE, ENTRYPOINT/CMD); the chart in deploy/helm/applistener runs this image.

# Build stage: runs on the build machine and cross-compiles for the target
# platform (BuildKit sets TARGETOS/TARGETARCH; empty means the build machine's).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
# The version stamped into the binary (applistener version); .git is not in
# the build context, so it comes from the build argument.
ARG VERSION=dev
# The commit stamped beside it (applistener version's revision=).
ARG REVISION=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The same flags as `make release` (scripts/release.sh), so that with the same
# Go version the binary is byte for byte the release's.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/applistener ./cmd/applistener

# Final stage: no shell, no package manager; CA certificates for the gateway's
# HTTPS are included in distroless/static.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="applistener" \
      org.opencontainers.image.description="Sandbox application listener: SNI-routed TLS to sandbox loopback apps" \
      org.opencontainers.image.source="https://github.com/applistener/applistener"
COPY --from=build /out/applistener /usr/local/bin/applistener
# 65532 is distroless's "nonroot"; the Helm chart runs as the same uid.
USER 65532:65532
# 8443: application listener; 5501: health (tcpSocket probes); 9090: admin (metrics).
EXPOSE 8443 5501 9090
ENTRYPOINT ["/usr/local/bin/applistener"]
CMD ["serve"]
