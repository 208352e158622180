# pd3 — two commands do all set-up on a fresh Debian machine:
#   make run    build and start pd3 up (memory node + host, embedded)
#   make test   vet, unit + integration tests with -race, short fuzz runs
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
GO ?= go
BIN := bin/pd3
# Fuzz budgets are execution counts, not durations: with a duration,
# Go 1.26's fuzz coordinator can fail a clean run with "context deadline
# exceeded" at the boundary (golang/go#75804, fixed in Go 1.27). Counts are
# sized to about 10 s each on the 2-core CI machine; FUZZSCALE multiplies.
FUZZSCALE ?= 1
# Minimising a large interesting input may take the default 60s, which in a
# short run leaves no time to fuzz (measured: 9 K vs 129 K executions).
FUZZMIN ?= 1s
RUN_ARGS ?=

# Every fuzz target as package:Target:executions.
FUZZ_TARGETS := \
	./memnode:FuzzReqHeader:300000 \
	./memnode:FuzzServerStream:40000 \
	./pagestore/pageproto:FuzzHeader:300000 \
	./pagestore/pageproto:FuzzServerStream:10000 \
	./dpu:FuzzPageParser:300000 \
	./dpu:FuzzNBDParser:300000

.PHONY: all build run test test-long vet fuzz bench bench-nbd pgbench-nbd deps deps-system tools-check clean

# Real clients the integration tests drive (Debian packages).
SYSTEM_PACKAGES := fio libnbd-bin nbdkit nbdfuse python3-libnbd qemu-utils xfsprogs e2fsprogs sqlite3 fuse3 util-linux

all: build

deps: tools-check
	$(GO) mod download

# Installs the real NBD/FUSE clients and filesystem tools the tests drive
# (as root; otherwise prints what to install).
deps-system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "pd3: tests need: $$missing (sudo apt-get install $$missing)"; fi; \
	fi

# Go is the only toolchain this stage needs; say so clearly if it is missing.
tools-check:
	@command -v $(GO) >/dev/null || { echo "pd3: Go is not installed (expected at /usr/local/go/bin)"; exit 1; }

build: deps
	$(GO) build -o $(BIN) ./tools/pd3

run: build
	./$(BIN) up $(RUN_ARGS)

vet: deps
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: vet deps-system
	$(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory fuzz

fuzz: deps
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZSCALE) )); \
	  echo "fuzz $$pkg $$name ($$n executions)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $${n}x -fuzzminimizetime $(FUZZMIN) $$pkg; \
	done

# Longer suites: more fuzzing and repeated race runs.
test-long: vet
	$(GO) test -race -count=5 -timeout 60m ./...
	$(MAKE) --no-print-directory fuzz FUZZSCALE=12 FUZZMIN=30s

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 3s ./memnode ./pagestore ./hostview
	./$(BIN) bench transport
	./$(BIN) bench page --systems local,sync,leap,pd3,pd3-split --dist uniform,zipf:0.99 --fixed-load 0.5
	./$(BIN) bench hostview
	./$(BIN) bench loadingzone

# fio's nbd engine: pd3 (data at a separate memory node) vs nbdkit memory
# vs the go-nbd reference server, IOPS ratios in one run.
bench-nbd: build deps-system
	./$(BIN) bench nbd

# PostgreSQL on ext4 on a loop device over nbdfuse over pd3's NBD export,
# pgbench vs the same on local disk (root). PGBENCH_SECONDS=60 for longer.
pgbench-nbd: build deps-system
	./tools/pgbench-nbd.sh

clean:
	rm -rf bin
