# srpd — see README.md. `make test` is what CI runs (via .ci/run).
GO       ?= go
PKGS     ?= ./...
BENCHTIME ?= 1s
TESTFLAGS ?= -race -timeout 20m

.PHONY: all build test fmt-check generate-check vet unit allocs model bench fuzz-smoke demo interop clean test-hostile soak release install deb

all: build

build:
	$(GO) build ./...

test: fmt-check generate-check vet unit allocs model

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The generated files (stringer's *_string.go, from the //go:generate lines; stringer is a
# go.mod tool, built from the module cache) must be current: regenerate and fail if that
# changes the tree. Changes already there before (a developer's uncommitted work) do not count.
generate-check:
	@before=$$(git status --porcelain; git diff); \
	$(GO) generate ./... || exit 1; \
	after=$$(git status --porcelain; git diff); \
	if [ "$$before" != "$$after" ]; then \
		echo "go generate ./... changed the tree (commit the regenerated files):"; \
		git status --porcelain; exit 1; \
	fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags gendocs ./cmd/srpctl/

unit:
	$(GO) test $(TESTFLAGS) $(PKGS)

# The zero-allocation checks of the I/O paths (srp, scsi, link, initiator, NBD, target, frpool,
# cqpoll) assert only without -race (the race detector allocates), so `unit` skips them: they
# run here, without -race. Part of `make test` (about 30 s).
ALLOC_TESTS ?= Alloc|NoAlloc|DoesNotAllocate|TestInlineRandomIO|TestRandomIO
allocs:
	$(GO) test -count=1 -run '$(ALLOC_TESTS)' ./srp/ ./scsi/... ./transport/... ./initiator/... ./target/ ./frpool/ ./internal/cqpoll/

# frpool's model-based test against softroce (get/register/post/complete/remote access/
# invalidate/remote invalidate/QP error/recovery with an rkey-replaying adversary) at the
# issue's 10,000 sequences; without -race, which `unit` already covers with fewer sequences.
# Part of `make test` (about a minute here).
MODEL_CHECKS ?= 10000
model:
	$(GO) test -count=1 -run 'TestModelSoftroce$$' ./frpool/ -rapid.checks=$(MODEL_CHECKS) -rapid.nofailfile

# make bench: bench/bench.sh, srpd's NBD export of a remote LUN (SRP target and initiator
# processes over softroce on loopback) against qemu-nbd and nbdkit over unix sockets and TCP
# with fio; softroce's RDMA WRITE/READ streams against a TCP stream between two processes; the
# same in a "two hosts" set-up (servers in a network namespace behind a veth pair, MTU 9000 and
# 1500; root, SKIPPED otherwise); then the target's memory with 1 and 64 sessions (settings
# through the environment: see bench/bench.sh). bench-nbd, bench-rdma, bench-netns and
# bench-mem run one section each; bench-go the Go micro-benchmarks with allocation counts
# (compare runs with benchstat).
.PHONY: bench-nbd bench-rdma bench-netns bench-mem bench-go
bench:
	bench/bench.sh
bench-nbd:
	bench/bench.sh nbd
bench-rdma:
	bench/bench.sh rdma
bench-netns:
	bench/bench.sh netns
bench-mem:
	bench/bench.sh mem
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

# Every fuzz target of the module (scripts/fuzz-smoke.sh): FUZZ_EXECS executions each (count-
# based: a time-based -fuzztime can fail at its deadline on Go 1.26, golang/go#75804) while
# FUZZ_BUDGET seconds last, then the remaining targets run their corpus only; a summary line
# per target, and failure if any failed. .ci/run runs it after `make test` (44 targets at the
# defaults: about 3 minutes here, 2 cores).
FUZZ_BUDGET ?= 420
FUZZ_EXECS ?= 20000x
FUZZ_PARALLEL ?= 2
fuzz-smoke:
	GO=$(GO) PKGS="$(PKGS)" FUZZ_BUDGET=$(FUZZ_BUDGET) FUZZ_EXECS=$(FUZZ_EXECS) FUZZ_PARALLEL=$(FUZZ_PARALLEL) ./scripts/fuzz-smoke.sh

demo:
	$(GO) run ./cmd/srpd demo

# Adversarial tests against a real srpd (test/hostile, build tag `hostile`): hostile RoCEv2
# packets, CM garbage, a forged-REQ flood, a 2,000-session flood and NBD abuse from 127.0.0.x,
# each followed by liveness, RSS-budget and verified-I/O checks. A few minutes; .ci/run runs it
# after `make test`. Without -race: the daemon is built plainly, its memory is what is measured.
# `make soak`: 64 sessions × 4 channels with verified I/O for 60 s, RSS and goroutines flat
# (about 90 s; not in CI).
HOSTILE_TIMEOUT ?= 10m
test-hostile:
	$(GO) vet -tags hostile ./test/hostile/
	$(GO) test -tags hostile -count=1 -v -timeout $(HOSTILE_TIMEOUT) -skip '^TestSoak$$' ./test/hostile/

soak:
	$(GO) vet -tags hostile ./test/hostile/
	SRPD_SOAK=1 $(GO) test -tags hostile -count=1 -v -timeout 5m -run '^TestSoak$$' ./test/hostile/

clean:
	$(GO) clean -testcache
	rm -rf dist

# Packaging. `make release`: dist/bin/srpd and srpctl, static (CGO_ENABLED=0: the default
# build is pure Go; the verbs and rbd builds are not packaged), -trimpath, stamped with
# `git describe --always --dirty` (srpd --version, srpctl --version); srpctl's man pages
# (cobra/doc, from a -tags gendocs build: cmd/srpctl/gendocs.go) and packaging/srpd.8,
# gzipped; srpctl's bash, zsh and fish completion (cobra's). The man pages' date is the
# commit's (SOURCE_DATE_EPOCH), so two builds of a commit are the same.
# `make install`: those, the unit (ExecStart pointed at $(SBINDIR)), the sysusers and tmpfiles
# entries, the examples, and configs/srpd.default.yaml as $(SYSCONFDIR)/srpd/srpd.yaml unless
# that exists, under $(DESTDIR); then run what it prints.
# `make deb`: `make install` into dist/root with Debian's paths, packaged by nfpm
# (packaging/nfpm.yaml, maintainer scripts in packaging/deb/): dist/srpd_VERSION_amd64.deb.
# nfpm is a tool of its own module (packaging/tools/go.mod, pinned there with its go.sum) so its
# many dependencies stay out of srpd's go.mod. scripts/deb-check.sh installs, checks and purges
# the package (root; CI runs it).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)
DEB_VERSION ?= $(shell ./packaging/deb-version.sh)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
RELEASE_GOFLAGS = -trimpath -ldflags '-s -w -X main.version=$(VERSION)'
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
DOCDIR ?= $(PREFIX)/share/doc/srpd

release:
	rm -rf dist/bin dist/man dist/completion
	mkdir -p dist/bin dist/man dist/completion
	CGO_ENABLED=0 $(GO) build $(RELEASE_GOFLAGS) -o dist/bin/ ./cmd/srpd ./cmd/srpctl
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) CGO_ENABLED=0 $(GO) run $(RELEASE_GOFLAGS) -tags gendocs ./cmd/srpctl gen-man dist/man
	cp packaging/srpd.8 dist/man/
	gzip -9n dist/man/*
	dist/bin/srpctl completion bash > dist/completion/srpctl.bash
	dist/bin/srpctl completion zsh > dist/completion/_srpctl
	dist/bin/srpctl completion fish > dist/completion/srpctl.fish

install: release
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) \
		$(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(DOCDIR)/examples
	install -m 0755 dist/bin/srpd $(DESTDIR)$(SBINDIR)/srpd
	install -m 0755 dist/bin/srpctl $(DESTDIR)$(BINDIR)/srpctl
	sed -E '/^Exec/ s|/usr/sbin/srpd|$(SBINDIR)/srpd|g; /^Exec/ s|/usr/bin/srpctl|$(BINDIR)/srpctl|g' \
		systemd/srpd.service > dist/srpd.service
	install -m 0644 dist/srpd.service $(DESTDIR)$(UNITDIR)/srpd.service
	install -m 0644 systemd/srpd.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/srpd.conf
	install -m 0644 systemd/srpd.tmpfiles.conf $(DESTDIR)$(TMPFILESDIR)/srpd.conf
	install -m 0644 dist/man/*.1.gz $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 dist/man/*.8.gz $(DESTDIR)$(MANDIR)/man8/
	install -m 0644 dist/completion/srpctl.bash $(DESTDIR)$(BASHCOMPDIR)/srpctl
	install -m 0644 dist/completion/_srpctl $(DESTDIR)$(ZSHCOMPDIR)/_srpctl
	install -m 0644 dist/completion/srpctl.fish $(DESTDIR)$(FISHCOMPDIR)/srpctl.fish
	install -m 0644 configs/srpd.reference.yaml systemd/blockdev.conf.example \
		systemd/verbs.conf.example $(DESTDIR)$(DOCDIR)/examples/
	@# /etc/srpd may already be 0770 root:srpd (tmpfiles): create it only if missing, and
	@# never overwrite an existing configuration.
	@if [ ! -d $(DESTDIR)$(SYSCONFDIR)/srpd ]; then install -d -m 0750 $(DESTDIR)$(SYSCONFDIR)/srpd; fi
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/srpd/srpd.yaml ]; then \
		echo "make install: keeping $(DESTDIR)$(SYSCONFDIR)/srpd/srpd.yaml"; \
	else \
		echo "install -m 0640 configs/srpd.default.yaml $(DESTDIR)$(SYSCONFDIR)/srpd/srpd.yaml"; \
		install -m 0640 configs/srpd.default.yaml $(DESTDIR)$(SYSCONFDIR)/srpd/srpd.yaml; \
	fi
	@if [ -z "$(DESTDIR)" ]; then \
		echo "Now: systemd-sysusers srpd.conf && systemd-tmpfiles --create srpd.conf && systemctl daemon-reload"; \
		echo "     then edit $(SYSCONFDIR)/srpd/srpd.yaml and: systemctl enable --now srpd"; \
	fi

# Debian's paths: the unit in /lib/systemd/system (Debian 12's place), zsh's vendor directory.
deb:
	rm -rf dist/root
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/dist/root PREFIX=/usr SYSCONFDIR=/etc \
		UNITDIR=/lib/systemd/system ZSHCOMPDIR=/usr/share/zsh/vendor-completions
	rm -f dist/*.deb
	@# Every file's time the commit's, as the man pages' date: the same commit, the same .deb.
	find dist/root -exec touch -h -d @$(SOURCE_DATE_EPOCH) {} +
	@# `go tool -n` builds nfpm (once; the build cache keeps it) and prints its path: nfpm runs
	@# here, where packaging/nfpm.yaml's relative paths start.
	nfpm=$$($(GO) -C packaging/tools tool -n nfpm) && \
	DEB_VERSION='$(DEB_VERSION)' SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
		$$nfpm package --config packaging/nfpm.yaml --packager deb --target dist/

# Interop with the Linux kernel (Debian 6.1 under QEMU, rdma_rxe; see $(INTEROP)/README.md):
# its ib_srp initiator logs in to srpd (the daemon, as the target) and runs checksummed I/O, then
# srpd (as the initiator, its NBD export driven by interop/cmd/nbdcheck) logs in to its ib_srpt;
# srpd runs from a configuration scripts/interop-srpd.sh generates; both captures must decode in
# tshark with no malformed packet. Then `interop/srp-verbs sg-checks` (about 25 s): sg3_utils in
# the ib_srp guest against srpd with an ALUA group and a sparse file LUN, outputs parsed
# (interop/lib/sgcheck.sh, its test interop/lib/sgcheck_test.sh first).
# Needs root; .ci/run runs it after `make test`. Extra settings go through the environment
# (SRP_INTEROP_FIO=1, SRP_INTEROP_GUEST_CPUS=2 SRP_INTEROP_LOGIN_OPTS=ch_count=2, ...).
INTEROP ?= ../shared/interop

.PHONY: interop
interop:
	INTEROP=$(INTEROP) GO=$(GO) ./scripts/interop.sh

# The kernel-verbs engine (transport/verbs, build tag `verbs`, cgo against rdma-core) on Debian's
# kernel rxe under QEMU (interop/srp-verbs; root): the transport conformance suite and the
# engine's tests in a guest, the kernel's ib_srp against srpd (driver verbs) in a guest, and
# srpd (driver verbs) in a guest logging in to srpd (softroce) on the host side
# (`srp-verbs test`; `srp-verbs all` adds the verbs-srptarget/verbs-srpinitiator modes). Not part of `make test`.
.PHONY: test-verbs
test-verbs:
	CGO_ENABLED=1 $(GO) vet -tags verbs ./transport/verbs/ ./interop/... ./internal/stack/ ./internal/daemon/ ./cmd/srpd/ ./cmd/srpctl/
	INTEROP=$(INTEROP) GO=$(GO) ./interop/srp-verbs test

# The Ceph RBD backend (scsi/backend, build tag `rbd`, cgo against librbd): `go vet -tags rbd`,
# then scripts/ceph-cluster.sh starts a throw-away cluster (one monitor, one memstore OSD,
# everything under a temporary directory), the backend conformance suite runs on RBD images
# and srpd serves an rbd LUN through its own initiator's NBD export, and two srpd gateways on one
# image fail over (cmd/srpd TestRBDMultipathFailover); the cluster is stopped and
# its directory removed whatever happens. Needs ceph-mon ceph-osd ceph-common librbd-dev
# librados-dev (Debian 12, 16.2 pacific) and a C compiler; .ci/run installs them. The packages
# run one after the other (-p 1): several of them export the cluster's one test image
# (SRPD_CEPH_IMAGE), and with the managed exclusive lock (the default) two of them writing at
# once would fence each other, as two live gateways would.
CEPH_TIMEOUT ?= 10m
.PHONY: test-ceph
test-ceph:
	CGO_ENABLED=1 $(GO) vet -tags rbd ./...
	@dir=$$(mktemp -d "$${TMPDIR:-/tmp}/srpd-ceph.XXXXXX") || exit 1; \
	trap './scripts/ceph-cluster.sh stop "$$dir"' EXIT; trap 'exit 130' INT TERM; \
	cephenv=$$(./scripts/ceph-cluster.sh start "$$dir") || exit 1; eval "$$cephenv"; \
	CGO_ENABLED=1 $(GO) test -tags rbd -race -count=1 -p 1 -v -timeout $(CEPH_TIMEOUT) -run 'RBD' \
		./scsi/backend/ ./internal/daemon/ ./internal/stack/ ./cmd/srpd/
