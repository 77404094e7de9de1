#!/usr/bin/env bash
# Interop with the Linux kernel (Debian's 6.1 under QEMU, rdma_rxe; see $INTEROP/README.md), the
# real srpd daemon in both directions, from a configuration scripts/interop-srpd.sh generates
# out of the harness' SRP_INTEROP_* variables:
#   kernel-initiator: the kernel's ib_srp logs in to srpd's target (a RAM LUN) and runs
#                     checksummed I/O;
#   kernel-initiator again with srpd SIGKILLed and restarted mid-I/O (fast recovery: DREQs from
#                     the state file, ib_srp back after its reconnect_delay);
#   kernel-target:    srpd logs in to the kernel's ib_srpt (LIO) with a session whose LUN 0 it
#                     exports over NBD; nbdcheck writes/reads ranges through the export, which the
#                     kernel target hashes in its own RAM disk.
#   kernel-initiator with an rbd LUN (a throw-away Ceph cluster; skipped, loudly, without
#                     ceph-mon and librbd-dev);
#   sg-checks (interop/srp-verbs, its own namespace and cache): sg3_utils in the kernel
#                     initiator's guest against srpd with an ALUA target port group and a sparse
#                     file LUN (RTPG, VPD 0x83/0x86, mode page 1, RSOC/RSTMF, LOG SENSE, GET LBA
#                     STATUS, a live standby and back), every output parsed on the host.
# Each shared-harness mode's RoCEv2 capture must then decode in tshark with no malformed packet.
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
$GO build -o bin/srpd ./cmd/srpd
$GO build -o bin/srpctl ./cmd/srpctl
$GO build -o bin/nbdcheck ./interop/cmd/nbdcheck
"$INTEROP/srp-interop" setup
# srpd's configuration, control and NBD sockets, one folder per mode (socket paths stay short).
WORK=$(mktemp -d /tmp/srpd-interop.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

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

# The target's keepalive_interval is 200ms (see scripts/interop-srpd.sh), so the capture has
# keep-alive probes the guest's rxe acknowledges.
run kernel-initiator scripts/interop-srpd.sh target "$WORK/target"
# Fast recovery: srpd SIGKILLed during the kernel's fio verify (after 8 MiB written) and started
# again; its DREQs make ib_srp reconnect after reconnect_delay (10 s), and the checksummed I/O
# and fio verify pass across the outage. fio in the guest needs fio on the host (.ci/run).
if command -v fio >/dev/null; then
  SRP_INTEROP_FIO=1 SRPD_INTEROP_KILL_AFTER_BYTES=8388608 run kernel-initiator scripts/interop-srpd.sh target-restart "$WORK/restart"
else
  echo "interop: restart run without fio verify (no fio on the host)" >&2
  run kernel-initiator scripts/interop-srpd.sh target-restart "$WORK/restart"
fi
grep 'RESTART: the kernel logged in again' "$OUT/kernel-initiator/cmd.stderr" | sed 's/^interop-srpd: /interop: kernel-initiator (restart): /'
run kernel-target scripts/interop-srpd.sh initiator "$WORK/initiator"

# The kernel's ib_srp against an rbd LUN (a throw-away Ceph cluster from scripts/ceph-cluster.sh,
# srpd built with -tags rbd): the same checksummed I/O and fio verify, landing in the RBD image.
# Needs ceph-mon, ceph-osd and librbd-dev (.ci/run installs them for make test-ceph first).
if command -v ceph-mon >/dev/null && [ -e /usr/include/rbd/librbd.h ]; then
  CGO_ENABLED=1 $GO build -tags rbd -o bin/srpd-rbd ./cmd/srpd
  # The cluster runs in the harness' namespace, started by the role (interop-srpd.sh target-rbd).
  if command -v fio >/dev/null; then
    SRPD=$PWD/bin/srpd-rbd SRP_INTEROP_FIO=1 run kernel-initiator scripts/interop-srpd.sh target-rbd "$WORK/rbd"
  else
    SRPD=$PWD/bin/srpd-rbd run kernel-initiator scripts/interop-srpd.sh target-rbd "$WORK/rbd"
  fi
  grep -E 'RESULT' "$OUT/kernel-initiator/summary.txt" | tail -1 | sed 's/^/interop: kernel-initiator (rbd): /' || true
  rbd_done="an rbd LUN, "
else
  echo "interop: SKIPPED: the kernel against an rbd LUN (no ceph-mon or librbd-dev: apt-get install ceph-mon ceph-osd ceph-common librbd-dev)" >&2
  rbd_done=""
fi

# sg3_utils through the kernel's ib_srp (about 25 s; the guest image from the same kernel
# cache). First the parser's own test on a recorded console, then the run.
interop/lib/sgcheck_test.sh > "$WORK/sgcheck_test.log" 2>&1 || { cat "$WORK/sgcheck_test.log" >&2; echo "interop: sg-checks parser test failed" >&2; exit 1; }
tail -n 1 "$WORK/sgcheck_test.log" | sed 's/^/interop: /'
start=$(date +%s) rc=0
INTEROP="$INTEROP" GO="$GO" interop/srp-verbs sg-checks > "$WORK/sg-checks.log" 2>&1 || rc=$?
SGOUT=${SRP_VERBS_OUT:-${SRP_VERBS_CACHE:-/var/tmp/srp-verbs}/out}/sg-checks
echo "interop: sg-checks: exit $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$WORK/sg-checks.log" >&2
  echo "---- $SGOUT/cmd.stderr" >&2
  tail -n 20 "$SGOUT/cmd.stderr" >&2 || true
  exit 1
fi
grep -E '^  sg checks:|RESULT:' "$WORK/sg-checks.log" | sed 's/^ */interop: sg-checks: /'
echo "interop: PASS (both directions, ${rbd_done:-}sg3_utils checks)"
