# Multi-stage build: a static binary on a distroless, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/applistener ./cmd/applistener

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/applistener /usr/local/bin/applistener
USER 65532:65532
# 8443: application listener; 5501: health (tcpSocket probes); 9090: admin (metrics).
EXPOSE 8443 5501 9090
ENTRYPOINT ["/usr/local/bin/applistener"]
CMD ["serve"]
