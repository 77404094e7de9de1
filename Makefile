# srpd — see README.md. `make test` is what CI runs (via .ci/run).
GO       ?= go
PKGS     ?= ./...
BENCHTIME ?= 1s
TESTFLAGS ?= -race -timeout 20m

.PHONY: all build test fmt-check generate-check vet unit allocs model bench fuzz-smoke demo interop clean test-hostile soak

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

# Interop with the Linux kernel (Debian 6.1 under QEMU, rdma_rxe; see $(INTEROP)/README.md):
# its ib_srp initiator logs in to srpd (the daemon, as the target) and runs checksummed I/O, then
# srpd (as the initiator, its NBD export driven by interop/cmd/nbdcheck) logs in to its ib_srpt;
# srpd runs from a configuration scripts/interop-srpd.sh generates; both captures must decode in
# tshark with no malformed packet.
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
# and srpd serves an rbd LUN through its own initiator's NBD export; the cluster is stopped and
# its directory removed whatever happens. Needs ceph-mon ceph-osd ceph-common librbd-dev
# librados-dev (Debian 12, 16.2 pacific) and a C compiler; .ci/run installs them.
CEPH_TIMEOUT ?= 10m
.PHONY: test-ceph
test-ceph:
	CGO_ENABLED=1 $(GO) vet -tags rbd ./...
	@dir=$$(mktemp -d "$${TMPDIR:-/tmp}/srpd-ceph.XXXXXX") || exit 1; \
	trap './scripts/ceph-cluster.sh stop "$$dir"' EXIT; trap 'exit 130' INT TERM; \
	cephenv=$$(./scripts/ceph-cluster.sh start "$$dir") || exit 1; eval "$$cephenv"; \
	CGO_ENABLED=1 $(GO) test -tags rbd -race -count=1 -v -timeout $(CEPH_TIMEOUT) -run 'RBD' \
		./scsi/backend/ ./internal/daemon/
