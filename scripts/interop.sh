#!/usr/bin/env bash
# Interop with the Linux kernel (Debian's 6.1 under QEMU, rdma_rxe; see $INTEROP/README.md):
#   kernel-initiator: the kernel's ib_srp logs in to cmd/srptarget and runs checksummed I/O;
#   kernel-target:    cmd/srpinitiator logs in to the kernel's ib_srpt (LIO) and writes/reads
#                     ranges that the kernel target hashes in its own RAM disk.
# Each mode's RoCEv2 capture must then decode in tshark with no malformed packet.
# Needs root. Exit status: 0 both pass; 1 a check failed; 2 the harness is missing or unusable.
set -euo pipefail
cd "$(dirname "$0")/.."

INTEROP=${INTEROP:-../shared/interop}
OUT=${SRP_INTEROP_OUT:-${SRP_INTEROP_CACHE:-/var/tmp/srp-interop}/out}
GO=${GO:-go}

if [ ! -x "$INTEROP/srp-interop" ]; then
  echo "interop: SKIPPED: no harness at $INTEROP/srp-interop (set INTEROP=...)" >&2
  exit 2
fi

mkdir -p bin
$GO build -o bin/srptarget ./cmd/srptarget
$GO build -o bin/srpinitiator ./cmd/srpinitiator
"$INTEROP/srp-interop" setup

# run MODE CMD: one harness run. Exit 3 is the harness's own error (the kernel target guest did
# not become ready, before our code ran at all): that alone is retried, once, and said so.
run() {
  local mode=$1; shift
  local start rc=0
  start=$(date +%s)
  "$INTEROP/srp-interop" "$mode" -- "$@" || rc=$?
  if [ "$rc" -eq 3 ]; then
    echo "interop: $mode: harness error (exit 3, guest not ready); retrying once" >&2
    rc=0
    "$INTEROP/srp-interop" "$mode" -- "$@" || rc=$?
  fi
  echo "interop: $mode: exit $rc after $(( $(date +%s) - start )) s"
  if [ "$rc" -ne 0 ]; then
    echo "---- $OUT/$mode/summary.txt" >&2
    tail -n 40 "$OUT/$mode/summary.txt" >&2 || true
    echo "---- $OUT/$mode/cmd.stderr" >&2
    tail -n 40 "$OUT/$mode/cmd.stderr" >&2 || true
    return 1
  fi
  local dec
  dec=$("$INTEROP/srp-interop" decode "$OUT/$mode/capture.pcap")
  echo "$dec" | grep -E '^(packets|malformed):' | sed "s/^/interop: $mode: /"
  if ! echo "$dec" | grep -qx 'malformed: 0'; then
    echo "interop: $mode: tshark finds malformed packets in the capture:" >&2
    echo "$dec" | sed -n '/first malformed/,$p' >&2
    return 1
  fi
}

# -keepalive 200ms: idle channels are probed with zero-length RDMA WRITEs after 50 ms of
# idleness, which the guest's rxe must acknowledge (else the channel is torn down and the I/O
# fails); the capture then has them for tshark too.
run kernel-initiator ./bin/srptarget -keepalive 200ms
run kernel-target ./bin/srpinitiator
echo "interop: PASS (both directions)"
