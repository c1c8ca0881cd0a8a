# applistener — see README.md.
GO        ?= go
BIN       ?= bin/applistener
# FUZZTIME is a count of executions, not a duration: with a duration Go's
# fuzz coordinator can report "context deadline exceeded" as a failure when
# its deadline fires while a worker is mid-call (go.dev/issue/75804, fixed in
# Go 1.27), which failed CI once with no failing input. A count has no
# deadline to race; on a loaded 2-core machine it only runs longer.
FUZZTIME  ?= 10000x
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
	./dispatch:FuzzAccessCredentials \
	./dispatch/internal/h2engine:FuzzServeConn

.PHONY: all build run test deps vet cross unit fuzz-brief fuzz bench bench-compare lint clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/applistener

## run: a working demo on loopback (certificate, demo app, route, listener).
run:
	$(GO) run ./cmd/applistener dev

## test: what the tests need (installed once), vet, a cross-compile check,
## every test with the race detector (and the few that judge the run order
## on one core without it: the detector randomises that order), and a short
## fuzz pass.
test: deps vet cross unit fuzz-brief

## deps: tools the tests use that Go does not build (Chromium), installed once.
deps:
	bash scripts/test-deps.sh

vet:
	$(GO) vet ./...

## cross: the tree builds and vets on macOS and on Windows (no run).
cross:
	GOOS=darwin $(GO) build ./... && GOOS=darwin $(GO) vet ./... && GOOS=windows $(GO) build ./... && GOOS=windows $(GO) vet ./...

## unit: every package's tests with the race detector, then the run-order
## tests (*OnOneCore) without it: the detector randomises which ready
## goroutine runs next, which is what they check.
unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'OnOneCore' ./internal/logsink ./dispatch ./dispatch/internal/h2client

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

## soak: the opt-in soaks, not part of `make test`: TestSoak (mixed traffic
## and route churn through a gateway session, default 10m) and TestSoakFaults
## (issue 25's fault matrix with real processes: gateway replicas killed, an
## etcd member lost, unparsable documents, a supervisor, the edge and an app
## restarted, routes churned through the write API, while load flows over
## HTTP/1.1, HTTP/2 and WebSockets, directly and through the edge;
## default 3m; zero contract violations). SOAK_DURATION sets each one's length,
## SOAK_RUN which run (soak-faults: the fault matrix only).
SOAK_RUN     ?= ^TestSoak
SOAK_TIMEOUT ?= 2h
.PHONY: soak soak-faults
soak:
	SOAK=1 $(GO) test -count=1 -run '$(SOAK_RUN)' -timeout $(SOAK_TIMEOUT) -v ./e2e/

soak-faults:
	$(MAKE) soak SOAK_RUN='^TestSoakFaults$$'

## release: the artefacts of release VERSION=x.y.z in dist/x.y.z (archives, OCI
## image, SBOMs, chart pinned by digest, SHA256SUMS); reproducible and offline
## once the modules are downloaded. See README.md "Install" and SECURITY.md.
.PHONY: release release-check release-sign
release:
	GO=$(GO) bash scripts/release.sh build $(VERSION)

## release-check: two builds with identical SHA256SUMS, then every artefact checked.
release-check:
	GO=$(GO) bash scripts/release.sh check $(VERSION)

## release-sign: ssh-keygen -Y sign dist/x.y.z/SHA256SUMS with SIGNING_KEY (offline).
release-sign:
	GO=$(GO) bash scripts/release.sh sign $(VERSION) $(SIGNING_KEY)

## test-k8s: the Helm chart installed with the Helm library on a real
## kube-apiserver (RBAC and admission on) with controller-manager, scheduler
## and kwok's fake nodes on loopback (deploy/k8stest). The control plane is
## built once into the user cache (scripts/k8s-bins.sh, tools/k8s).
## Not part of `make test`: a cold build of the control plane takes ~5 minutes
## of 2 cores (far more on a loaded machine) and `make test` must stay well
## under CI's 15 minutes. .ci/run runs it as a step of its own.
.PHONY: test-k8s
test-k8s:
	GO=$(GO) bash scripts/k8s-bins.sh
	cd deploy/k8stest && $(GO) test -count=1 -timeout 20m -v ./...

lint:
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run ./...

clean:
	rm -rf bin dist
