# The same commands CI runs (.ci/run calls `make test`).
# withlock version prints these; goreleaser stamps the same three (.goreleaser.yaml).
# The date is the commit's, not the build's, so that a commit builds the same bytes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE ?= $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
LDFLAGS := -s -w -X github.com/withlock/withlock/cmd.version=$(VERSION) \
	-X github.com/withlock/withlock/cmd.commit=$(COMMIT) -X github.com/withlock/withlock/cmd.date=$(DATE)

.PHONY: build man test test-race test-e2e test-release lint deps bench stress dist image

# A static binary: no libc, runs in any container image. grpcnotrace keeps
# gRPC's request tracing (golang.org/x/net/trace and what it links) out of
# the etcd client: withlock never serves its pages.
build:
	CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags '$(LDFLAGS)' -o withlock .

# The man pages and shell completions, from the source, as the packages
# carry them: build/docs/man/withlock.1.gz (one page per command) and
# build/docs/completions/. Read a page with man -l build/docs/man/withlock.1.gz.
man:
	cd internal/release && go run ./docs -version $(VERSION) -date $(DATE) ../../build/docs

# Everything, against real servers, with the race detector; then the
# release module's tests (they need Go modules only, not goreleaser).
# Four tests at a time in a package, not one a core: the scripts and most
# backend tests spend their time waiting for leases to run out and servers
# to restart, not computing.
test: deps lint
	go test -race -count=1 -parallel 4 -timeout 30m ./...
	cd internal/bench && go test -count=1 ./...
	$(MAKE) test-release

# internal/release: the image builder (built and read back); LICENSE in the
# archives and packages (.goreleaser.yaml); examples/ (k8s manifests decoded
# strictly, systemd units verified with KillMode=mixed, every command line
# run); and the docs (every link and anchor resolves, every flag documented,
# every man page rendered by man -l without a warning).
test-release:
	cd internal/release && go test -count=1 ./...

test-race: test

# Only the end-to-end scripts in testdata/script.
test-e2e: deps
	go test -count=1 -run TestScripts .

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	go vet ./...
	cd internal/release && go vet ./...
	cd internal/bench && go vet ./...

# Installs what the tests need (PostgreSQL, Redis, etcd, MariaDB, node/npm,
# util-linux, systemd-analyze, man and groff) if missing; see CONTRIBUTING.md.
deps:
	@bash scripts/test-deps

# Benchmarks, not part of test: Go micro-benchmarks of the hot paths, then
# whole-process figures side by side with flock, psql, etcdctl lock and the npm withlock
# (internal/bench, a module of its own, starts its own servers and installs
# hyperfine if missing). It writes docs/performance.md and its SVG charts.
bench: deps
	go test -run '^$$' -bench . -benchtime 200x -count 5 ./internal/lock/...
	cd internal/bench && go run . -doc ../../docs/performance.md

# The stress test, not part of test (which runs a few seconds of it per
# backend and mode): 16 contenders take one lock STRESS_RUNS times per
# backend and mode (exclusive, a semaphore of 3, shared mixed with
# exclusive), through a proxy, while an injector cuts connections,
# black-holes the network, restarts and freezes the server, and freezes
# holders. One line per backend and mode at the end; see CONTRIBUTING.md,
# "The stress test". Then 100 waiters behind one holder per backend (make
# test runs 10). Then the Redis Cluster stress test, with a fault proxy in
# front of one node, for 2 minutes per mode (make test runs seconds).
STRESS_RUNS ?= 1000
stress: deps
	go test -count=1 -v -timeout 90m -parallel 4 -run '^(TestStress|TestManyWaiters)$$' ./internal/stress -stress.long -stress.runs $(STRESS_RUNS) -stress.waiters 100
	go test -race -count=1 -v -timeout 30m -run '^TestClusterStress$$' ./internal/lock/redis -stress.long

# A snapshot release into dist/ (RELEASING.md): goreleaser, pinned in
# internal/tools, builds the archives, checksums.txt and the .deb/.rpm/.apk;
# then the OCI image is added (goreleaser builds images only with a Docker
# engine) and the man pages are copied beside them.
# goreleaser wants the remote's URL: a checkout without a remote (a git
# worktree, say) gets the project's, for this run only.
ifeq ($(shell git remote 2>/dev/null),)
dist: export GIT_CONFIG_COUNT = 1
dist: export GIT_CONFIG_KEY_0 = remote.origin.url
dist: export GIT_CONFIG_VALUE_0 = https://github.com/withlock/withlock
endif
dist: bin/goreleaser
	bin/goreleaser release --snapshot --clean
	$(MAKE) image
	cp -R build/docs/man dist/man

# The OCI image of the linux binaries in dist/, added to checksums.txt.
image:
	cd internal/release && go run ./image dist -created $(DATE) ../../dist

# The release workflow's step on a tag (needs GITHUB_TOKEN and gh): publish,
# then attach the image and the checksums that now list it.
release: bin/goreleaser
	bin/goreleaser release --clean
	$(MAKE) image
	gh release upload $(VERSION) dist/*_oci.tar dist/checksums.txt --clobber

bin/goreleaser: internal/tools/go.mod internal/tools/go.sum
	cd internal/tools && go build -o ../../bin/goreleaser github.com/goreleaser/goreleaser/v2
