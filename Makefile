# lockfs: make build | test | bench | run | run-multihost | vet | storm | deps | clean
#
# `make test` and `make run` install their prerequisites themselves when run
# as root on Debian/Ubuntu (see scripts/deps.sh).

GO      ?= go
BIN     := bin/lockfs
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

# The full kill-during-wait storm (`make storm`); `make test` runs 300 trials.
STORM_TRIALS ?= 10000

.PHONY: all build test bench bench-smoke run run-multihost vet fmt-check storm deps clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/lockfs

# Prerequisites: fuse3 (fusermount3), util-linux (flock, setpriv), python3,
# sqlite3, stress-ng. Installs what is missing when root with apt-get.
deps:
	@scripts/deps.sh

fmt-check:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then \
		echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$out"; exit 1; fi

# third_party/bazil.org/fuse is its own module (a `replace` needs a go.mod
# there), so ./... in the root stops at it: vet and test it explicitly.
FORK := third_party/bazil.org/fuse

vet:
	$(GO) vet ./...
	cd $(FORK) && $(GO) vet ./...

test: deps fmt-check vet
	cd $(FORK) && $(GO) test -race -count=1 -timeout 10m ./...
	$(GO) test -race -count=1 -timeout 40m ./...

# The performance table (docs/BENCHMARKS.md): lockfs side by side with its
# references in one run, about 5-8 minutes; writes bench/results.json.
bench: deps
	$(GO) run ./bench/cmd/lockfs-bench -out bench/results.json

# The harness at tiny sizes; `make test` runs it too (bench.TestSmoke).
bench-smoke: deps
	$(GO) test -count=1 -v -run 'TestSmoke' ./bench/

# The full kill-during-wait storm: 10,000 waiters SIGKILLed at random instants
# of their lock wait; none may be left in state D.
storm: deps
	LOCKFS_STORM_TRIALS=$(STORM_TRIALS) $(GO) test -race -count=1 -timeout 60m -v \
		-run 'TestKillDuringWaitStorm' ./integration/

# Mount demo/source at demo/mnt in the foreground; Ctrl-C unmounts.
run: deps build
	@scripts/run-demo.sh $(BIN)

# Two "hosts" on this machine sharing locks through a GCS emulator: builds
# bin/lockfs and bin/fake-gcs-server, mounts demo/hostA/mnt and
# demo/hostB/mnt with --backend gcs; Ctrl-C unmounts both, stops the emulator.
run-multihost: deps
	@GO="$(GO)" LDFLAGS="$(LDFLAGS)" scripts/run-multihost.sh

clean:
	@for m in demo/mnt demo/hostA/mnt demo/hostB/mnt; do \
		if grep -qs " $(CURDIR)/$$m " /proc/mounts; then fusermount3 -uz $$m || true; fi; done
	rm -rf bin demo

# Install the binary, the mount(8) helper for /etc/fstab lines of type
# fuse.lockfs, and the systemd unit template (see docs/OPERATIONS.md).
PREFIX  ?= /usr/local
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system

install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/lockfs
	install -d $(DESTDIR)$(SBINDIR)
	ln -sf $(PREFIX)/bin/lockfs $(DESTDIR)$(SBINDIR)/mount.fuse.lockfs
	install -D -m 0644 contrib/systemd/lockfs@.service $(DESTDIR)$(UNITDIR)/lockfs@.service
	install -d -m 0755 $(DESTDIR)/etc/lockfs
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed $(PREFIX)/bin/lockfs, $(SBINDIR)/mount.fuse.lockfs and $(UNITDIR)/lockfs@.service"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/lockfs $(DESTDIR)$(SBINDIR)/mount.fuse.lockfs $(DESTDIR)$(UNITDIR)/lockfs@.service
