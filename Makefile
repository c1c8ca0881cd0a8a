# applistener — see README.md.
GO        ?= go
BIN       ?= bin/applistener
FUZZTIME  ?= 3s
LONGFUZZ  ?= 2m
# VERSION is stamped into the binary (applistener version): the nearest tag,
# commits since, abbreviated revision, -dirty; "dev" outside a git checkout.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

# package:target pairs run by `make fuzz` (and briefly by `make test`).
FUZZ_TARGETS = \
	./internal/tlshello:FuzzReadClientHello \
	./internal/proxyproto:FuzzParse \
	./routes:FuzzNormalizeHost \
	./routes:FuzzParseHostname \
	./routes:FuzzParseDocument \
	./accesstoken:FuzzParse \
	./accesstoken:FuzzVerify \
	./dispatch:FuzzParseRequestHead \
	./dispatch:FuzzCopyChunked \
	./dispatch:FuzzParseResponseHead \
	./dispatch:FuzzFramingAliases \
	./dispatch:FuzzH2CResponse \
	./dispatch/internal/h2engine:FuzzServeConn

.PHONY: all build run test deps vet cross unit fuzz-brief fuzz bench bench-compare lint clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/applistener

## run: a working demo on loopback (certificate, demo app, route, listener).
run:
	$(GO) run ./cmd/applistener dev

## test: what the tests need (installed once), vet, a cross-compile check,
## every test with the race detector, and a short fuzz pass.
test: deps vet cross unit fuzz-brief

## deps: tools the tests use that Go does not build (Chromium), installed once.
deps:
	bash scripts/test-deps.sh

vet:
	$(GO) vet ./...

## cross: the tree builds and vets on macOS and on Windows (no run).
cross:
	GOOS=darwin $(GO) build ./... && GOOS=darwin $(GO) vet ./... && GOOS=windows $(GO) build ./... && GOOS=windows $(GO) vet ./...

unit:
	$(GO) test -race -count=1 ./...

fuzz-brief:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg > /tmp/fuzz.$$$$.log 2>&1 || { cat /tmp/fuzz.$$$$.log; rm -f /tmp/fuzz.$$$$.log; exit 1; }; \
		rm -f /tmp/fuzz.$$$$.log; \
	done

## fuzz: every fuzz target for $(LONGFUZZ).
fuzz:
	$(MAKE) fuzz-brief FUZZTIME=$(LONGFUZZ)

## bench: the Go micro-benchmarks (route table, parser, handshake).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./routes ./dispatch ./internal/tlshello ./tlsconf

## bench-compare: applistener side by side with nginx, HAProxy and Caddy on this
## machine (installs what it needs; BENCH_QUICK=1 for a ~4-minute smoke run).
## Results: bench/results/latest.md and latest.json.
bench-compare:
	bash bench/run.sh

## soak: the gateway-session soak test (SOAK_DURATION, default 10m).
.PHONY: soak
soak:
	SOAK=1 $(GO) test -run TestSoak -timeout 30m -v ./e2e/

lint:
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run ./...

clean:
	rm -rf bin
