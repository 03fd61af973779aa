# The same commands CI runs (.ci/run calls `make test`).
# withlock version prints these; goreleaser stamps the same three (.goreleaser.yaml).
# The date is the commit's, not the build's, so that a commit builds the same bytes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE ?= $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
LDFLAGS := -s -w -X github.com/withlock/withlock/cmd.version=$(VERSION) \
	-X github.com/withlock/withlock/cmd.commit=$(COMMIT) -X github.com/withlock/withlock/cmd.date=$(DATE)

.PHONY: build test test-race test-e2e lint deps bench stress

# A static binary: no libc, runs in any container image.
build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o withlock .

# Everything, against real servers, with the race detector.
test: deps lint
	go test -race -count=1 -timeout 30m ./...

test-race: test

# Only the end-to-end scripts in testdata/script.
test-e2e: deps
	go test -count=1 -run TestScripts .

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	go vet ./...

# Installs what the tests need (PostgreSQL, Redis, etcd, MariaDB, node/npm, util-linux) if missing.
deps:
	@bash scripts/test-deps

# Benchmarks, not part of test: Go micro-benchmarks of the hot paths, then
# whole-process figures side by side with flock, psql, etcdctl lock and the npm withlock
# (internal/bench starts its own servers; it installs hyperfine if missing).
bench: deps
	go test -run '^$$' -bench . -benchtime 200x -count 5 ./internal/lock/...
	go run ./internal/bench

# The stress test of issue 15, not part of test (which runs a few seconds of it
# per backend): 16 contenders take one lock STRESS_RUNS times per backend,
# through a proxy that cuts connections and black-holes the network at random.
# One line per backend at the end; see README, "Stress test".
STRESS_RUNS ?= 1000
stress: deps
	go test -count=1 -v -timeout 90m -parallel 4 -run '^TestStress$$' ./internal/stress -stress.long -stress.runs $(STRESS_RUNS)
