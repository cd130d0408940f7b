# lockfs: make build | man | dist | test | bench | bench-scale | run | run-multihost[-etcd] | vet | storm | deps | clean | install
#
# `make test` and `make run` install their prerequisites themselves when run
# as root on Debian/Ubuntu (see scripts/deps.sh).

GO      ?= go
# Go is expected on PATH or in /usr/local/go/bin (where the go.dev tarball
# unpacks); the gocheck target says so before anything is installed.
ifeq ($(shell command -v $(GO) 2>/dev/null),)
ifneq ($(wildcard /usr/local/go/bin/go),)
export PATH := /usr/local/go/bin:$(PATH)
endif
endif
GOVERSION := $(shell sed -n 's/^go //p' go.mod)
BIN     := bin/lockfs
# The version is semantic, from the nearest git tag (v1.2.3, or
# v1.2.3-4-gHASH four commits after it); with no tag in the history it is
# v0.0.0-N-gHASH (N commits so far), and "-dirty" marks uncommitted changes.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || \
	echo "v0.0.0-$$(git rev-list --count HEAD 2>/dev/null || echo 0)-g$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$$(git diff --quiet HEAD 2>/dev/null || echo -dirty)")
LDFLAGS := -X main.version=$(VERSION)
# Build tags of every lockfs build (internal/buildflags.Tags says why; keep
# the two the same): the GCS client's gRPC-only dependencies stay out.
TAGS    := disable_grpc_modules

# The full kill-during-wait storm (`make storm`); `make test` runs 300 trials.
STORM_TRIALS ?= 10000

.PHONY: all gocheck build man unit install uninstall dist test bench bench-smoke run run-multihost run-multihost-etcd vet fmt-check storm deps deps-run deps-bench deps-multihost deps-multihost-etcd clean

all: build

# Go first: before installing packages, say where Go is expected.
gocheck:
	@command -v $(GO) >/dev/null 2>&1 || { \
		echo "lockfs: Go $(GOVERSION) or later is needed, and '$(GO)' is neither on PATH nor in /usr/local/go/bin."; \
		echo "  Install it from https://go.dev/dl/ into /usr/local/go (tar -C /usr/local -xzf go$(GOVERSION).linux-$$(dpkg --print-architecture 2>/dev/null || echo amd64).tar.gz),"; \
		echo "  or name it: make GO=/path/to/go/bin/go ..."; exit 1; } >&2

build: gocheck
	$(GO) build -tags $(TAGS) -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/lockfs

# Man pages, one per command, generated from the command tree into
# $(MANBUILD) (not committed); `make install` installs them.
MANBUILD := bin/man

man: build
	rm -rf $(MANBUILD)
	$(BIN) gen-man $(MANBUILD)

# Prerequisites, installed when missing (as root, with apt-get), for what
# each target needs and no more: the tests' tools (deps: fuse3, util-linux,
# python3, sqlite3, stress-ng, rsync, gcc, promtool, etcd), the demo's (deps-run:
# fuse3 and util-linux only; deps-bench adds python3, rsync and etcd;
# deps-multihost-etcd adds etcd). Nothing installed is left enabled or running
# (scripts/deps.sh).
deps: gocheck
	@scripts/deps.sh test

deps-run: gocheck
	@scripts/deps.sh run

deps-bench: gocheck
	@scripts/deps.sh bench

deps-multihost: gocheck
	@scripts/deps.sh multihost

deps-multihost-etcd: gocheck
	@scripts/deps.sh multihost-etcd

fmt-check:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then \
		echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$out"; exit 1; fi

# third_party/bazil.org/fuse and the GCS emulator gcsemu are modules of
# their own (a `replace` needs a go.mod there), so ./... in the root stops
# at them: vet and test them explicitly.
FORK    := third_party/bazil.org/fuse
GCSEMU  := third_party/github.com/fullstorydev/emulators/storage

vet: gocheck
	$(GO) vet -tags $(TAGS) ./...
	cd $(FORK) && $(GO) vet ./...
	cd $(GCSEMU) && $(GO) vet ./...

test: gocheck deps fmt-check vet
	cd $(FORK) && $(GO) test -race -count=1 -timeout 10m ./...
	cd $(GCSEMU) && $(GO) test -race -count=1 -timeout 10m ./...
	$(GO) test -tags $(TAGS) -race -count=1 -timeout 40m ./...

# The performance table (docs/BENCHMARKS.md): lockfs side by side with its
# references in one run, about 10 minutes (it must stay under 12); writes
# bench/results.json. deps-bench installs what its measurements run.
bench: deps-bench
	$(GO) run -tags $(TAGS) ./bench/cmd/lockfs-bench -out bench/results.json

# The scale measurements (docs/BENCHMARKS.md, "At scale"): 1,000 hosts ×
# 100 locks in helper processes on GCS and on etcd, and 100,000 locks held
# through a gcs daemon; 30-45 minutes. Not part of `make test` or `make bench`. Its keys
# are merged into bench/results.json.
bench-scale: deps
	$(GO) run -tags $(TAGS) ./bench/cmd/lockfs-bench -scale -out bench/results.json

# The harness at tiny sizes; `make test` runs it too (bench.TestSmoke).
bench-smoke: deps
	$(GO) test -tags $(TAGS) -count=1 -v -run 'TestSmoke' ./bench/

# The full kill-during-wait storm: 10,000 waiters SIGKILLed at random instants
# of their lock wait; none may be left in state D.
storm: deps
	LOCKFS_STORM_TRIALS=$(STORM_TRIALS) $(GO) test -tags $(TAGS) -race -count=1 -timeout 60m -v \
		-run 'TestKillDuringWaitStorm' ./integration/

# Mount demo/source at demo/mnt in the foreground; Ctrl-C unmounts.
run: deps-run build
	@scripts/run-demo.sh $(BIN)

# Two "hosts" on this machine sharing locks through a GCS emulator: builds
# bin/lockfs and bin/fake-gcs-server, mounts demo/hostA/mnt and
# demo/hostB/mnt with --backend gcs; Ctrl-C unmounts both, stops the emulator.
run-multihost: deps-multihost
	@GO="$(GO)" LDFLAGS="$(LDFLAGS)" TAGS="$(TAGS)" scripts/run-multihost.sh

# The same two hosts sharing a one-member etcd server (Debian's etcd-server)
# through --backend etcd.
run-multihost-etcd: deps-multihost-etcd
	@BACKEND=etcd GO="$(GO)" LDFLAGS="$(LDFLAGS)" TAGS="$(TAGS)" scripts/run-multihost.sh

# Release artefacts in dist/ (gitignored): a static, stripped binary and a
# .deb (nfpm, pinned as a Go tool in go.mod) with the binary, the mount
# helper link, the systemd unit, the logrotate rule, man pages and shell
# completion. scripts/test-deb.sh (run by integration.TestDebPackage)
# checks the package's contents and installs and removes it in a scratch
# root with dpkg --root.
DIST       := dist
GOARCH     ?= $(shell $(GO) env GOARCH)
DEBVERSION := $(shell echo '$(VERSION)' | sed 's/^v//; s/-/+/g')

dist: gocheck
	rm -rf $(DIST)
	mkdir -p $(DIST)/man $(DIST)/completion
	CGO_ENABLED=0 $(GO) build -tags $(TAGS) -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(DIST)/lockfs ./cmd/lockfs
	$(DIST)/lockfs gen-man $(DIST)/man
	gzip -9n $(DIST)/man/*.1
	$(DIST)/lockfs completion bash >$(DIST)/completion/lockfs.bash
	$(DIST)/lockfs completion zsh >$(DIST)/completion/_lockfs
	$(DIST)/lockfs completion fish >$(DIST)/completion/lockfs.fish
	sed 's|@BINDIR@|/usr/bin|g' contrib/systemd/lockfs@.service.in >$(DIST)/lockfs@.service
	scripts/deb-docs.sh $(DIST) '$(DEBVERSION)'
	@if GOPROXY=off $(GO) list -deps github.com/goreleaser/nfpm/v2/cmd/nfpm >/dev/null 2>&1; then \
		echo "dist: building the .deb with nfpm (go tool nfpm, pinned in go.mod; built once, then cached)"; \
	else \
		echo "dist: downloading and building the packager, nfpm (pinned in go.mod), and its dependencies:" \
			"the first make dist takes a few minutes, later ones seconds"; \
	fi
	VERSION='$(DEBVERSION)' ARCH='$(GOARCH)' $(GO) tool nfpm package --config packaging/nfpm.yaml --packager deb --target $(DIST)/
	@ls -l $(DIST)/lockfs $(DIST)/*.deb

clean:
	@for m in demo/mnt demo/hostA/mnt demo/hostB/mnt; do \
		if grep -qs " $(CURDIR)/$$m " /proc/mounts; then fusermount3 -uz $$m || true; fi; done
	rm -rf bin demo dist

# Install the binary, the mount(8) helper for /etc/fstab lines of type
# fuse.lockfs, the man pages, shell completion and the systemd unit template
# (see docs/OPERATIONS.md).
PREFIX  ?= /usr/local
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
MANDIR  ?= $(PREFIX)/share/man
COMPDIR_BASH ?= $(PREFIX)/share/bash-completion/completions
COMPDIR_ZSH  ?= $(PREFIX)/share/zsh/site-functions
COMPDIR_FISH ?= $(PREFIX)/share/fish/vendor_completions.d
LOGROTATEDIR ?= /etc/logrotate.d

# The unit names the binary by its installed path.
unit:
	@mkdir -p bin
	sed 's|@BINDIR@|$(PREFIX)/bin|g' contrib/systemd/lockfs@.service.in >bin/lockfs@.service

install: build man unit
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/lockfs
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(COMPDIR_BASH) $(DESTDIR)$(COMPDIR_ZSH) $(DESTDIR)$(COMPDIR_FISH)
	install -m 0644 $(MANBUILD)/*.1 $(DESTDIR)$(MANDIR)/man1/
	$(BIN) completion bash >$(DESTDIR)$(COMPDIR_BASH)/lockfs
	$(BIN) completion zsh >$(DESTDIR)$(COMPDIR_ZSH)/_lockfs
	$(BIN) completion fish >$(DESTDIR)$(COMPDIR_FISH)/lockfs.fish
	install -d $(DESTDIR)$(SBINDIR)
	ln -sf $(PREFIX)/bin/lockfs $(DESTDIR)$(SBINDIR)/mount.fuse.lockfs
	install -D -m 0644 bin/lockfs@.service $(DESTDIR)$(UNITDIR)/lockfs@.service
	install -D -m 0644 contrib/logrotate/lockfs $(DESTDIR)$(LOGROTATEDIR)/lockfs
	install -D -m 0644 LICENSE $(DESTDIR)$(PREFIX)/share/doc/lockfs/LICENSE
	install -d -m 0755 $(DESTDIR)/etc/lockfs
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed $(PREFIX)/bin/lockfs, $(SBINDIR)/mount.fuse.lockfs, $(UNITDIR)/lockfs@.service, man pages and shell completion"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/lockfs $(DESTDIR)$(SBINDIR)/mount.fuse.lockfs $(DESTDIR)$(UNITDIR)/lockfs@.service
	rm -f $(DESTDIR)$(LOGROTATEDIR)/lockfs
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/lockfs
	rm -f $(DESTDIR)$(MANDIR)/man1/lockfs.1 $(DESTDIR)$(MANDIR)/man1/lockfs-*.1
	rm -f $(DESTDIR)$(COMPDIR_BASH)/lockfs $(DESTDIR)$(COMPDIR_ZSH)/_lockfs $(DESTDIR)$(COMPDIR_FISH)/lockfs.fish
