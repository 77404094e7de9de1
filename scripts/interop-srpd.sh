#!/usr/bin/env bash
# The real srpd as the process under test of the kernel interop harness
# ($INTEROP/srp-interop; scripts/interop.sh, interop/srp-verbs softroce-target): a configuration
# generated from the SRP_INTEROP_* variables the harness gives its command, then `srpd -c`, as
# users run it.
#
#   interop-srpd.sh target DIR
#       A softroce transport on $SRP_INTEROP_ADDR, UDP $SRP_INTEROP_ROCE_PORT, and a target with
#       port ID $SRP_INTEROP_TARGET_PORT_ID (or id_ext ‖ ioc_guid) on RDMA CM port
#       $SRP_INTEROP_PORT exporting a RAM LUN 0 ($SRPD_INTEROP_LUN_MIB MiB, default 64) to any
#       initiator. srpd runs until the harness stops it (SIGTERM: srpd drains and exits).
#   interop-srpd.sh target-restart DIR
#       As target, but with a file LUN (DIR/lun0.img), and srpd is SIGKILLed while the kernel
#       has written more than $SRPD_INTEROP_KILL_AFTER_BYTES (default 0; 8388608 lands in the
#       harness' fio verify with SRP_INTEROP_FIO=1) and started again (what it acknowledged is
#       in the file): the time
#       until the kernel has logged in again is printed (RESTART: ... s after the SIGKILL).
#   interop-srpd.sh target-addlun DIR
#       As target; once the kernel has written, LUN 1 (16 MiB RAM) is added live with srpctl.
#   interop-srpd.sh target-alua DIR
#       As target, but the target port is in ALUA target port group 1 (relative target port 1,
#       active/optimized) with a peer group 2 (relative target port 2, active/non-optimized),
#       and LUN 0 is a sparse file (DIR/lun0.img, created empty) with the NAA identifier
#       $SRPD_INTEROP_NAA (default 6001405abcdef0123456789abcdef012): what the sg3_utils checks
#       of interop/srp-verbs sg-checks read back; srp-verbs changes group 1's state live with
#       srpctl target alua.
#   interop-srpd.sh target-rbd DIR
#       As target, but LUN 0 is an RBD image (64 MiB) of a throw-away Ceph cluster this role
#       starts in the harness' namespace (scripts/ceph-cluster.sh) and stops after srpd, through
#       librbd, with $SRPD built with -tags rbd; the kernel's checksummed I/O and fio verify land
#       in the image.
#   interop-srpd.sh initiator DIR
#       A softroce transport on $SRP_INTEROP_ADDR and a session to $SRP_INTEROP_TARGET_ADDR port
#       $SRP_INTEROP_PORT (the kernel's ib_srpt) whose LUN 0 srpd exports over NBD on DIR/lun0.nbd.
#       nbdcheck writes random data, flushes, reads back and compares through the export (two
#       passes over six ranges; the export must have $SRP_INTEROP_LUN_BYTES bytes); each checked
#       range becomes a harness hash line on stdout,
#           SRP_INTEROP_SHA256=<sha256 hex> OFFSET=<bytes> LEN=<bytes>
#       so that the kernel target hashes the same range of its RAM disk. Then srpd is stopped
#       with SIGTERM: the session logs out. Exit 0 when nbdcheck passed, srpd logged out in time
#       and exited 0.
#
# DIR (created if need be) receives srpd.yaml, srpd's control socket, the NBD socket and logs.
# Binaries: $SRPD (default bin/srpd of this repository), $NBDCHECK (bin/nbdcheck), and $SRPCTL
# (bin/srpctl; optional: it shows the daemon's view of the session in the log).
# Everything srpd logs goes to stderr (the harness' cmd.stderr), after the configuration.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -eq 2 ] || usage
ROLE=$1
DIR=$2
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SRPD=${SRPD:-$REPO/bin/srpd}
NBDCHECK=${NBDCHECK:-$REPO/bin/nbdcheck}
SRPCTL=${SRPCTL:-$REPO/bin/srpctl}
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)" # sockets need absolute paths
CONF=$DIR/srpd.yaml

say() { echo "interop-srpd: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }
need() { [ -n "${!1:-}" ] || die "\$$1 is not set (run under srp-interop)"; }

need SRP_INTEROP_ADDR
ROCE_PORT=${SRP_INTEROP_ROCE_PORT:-4791}
CM_PORT=${SRP_INTEROP_PORT:-5555}
PORT_ID=${SRP_INTEROP_TARGET_PORT_ID:-}
if [ -z "$PORT_ID" ]; then
  need SRP_INTEROP_ID_EXT
  need SRP_INTEROP_IOC_GUID
  PORT_ID=$SRP_INTEROP_ID_EXT$SRP_INTEROP_IOC_GUID
fi

# common_conf: the transport, the control socket and the logs (both roles). The transport has
# $SRPD_INTEROP_QUEUES receive queues (default 2): the kernel's rxe sends every QP's packets to
# port 4791 and must see no difference.
common_conf() {
  cat <<CONF
version: 1
transports:
  - name: bridge
    driver: softroce
    address: $SRP_INTEROP_ADDR
    udp_port: $ROCE_PORT
    queues: ${SRPD_INTEROP_QUEUES:-2}
control:
  socket: $DIR/srpd.sock
  mode: "0600"
logging:
  level: info
  format: console
CONF
}

# target_conf [file|alua]: the target role's configuration; with "file", LUN 0 is a file in DIR
# (it must outlive a killed srpd), else RAM; "alua" adds the ALUA groups and a file LUN with a
# fixed NAA (target-alua).
target_conf() {
  local lun="{id: 0, backend: ram, size: ${SRPD_INTEROP_LUN_MIB:-64}MiB}" alua=""
  if [ "${1:-}" = file ] || [ "${1:-}" = alua ]; then
    lun="{id: 0, backend: file, path: $DIR/lun0.img, create: true, size: ${SRPD_INTEROP_LUN_MIB:-64}MiB}"
  fi
  if [ "${1:-}" = rbd ]; then
    need SRPD_CEPH_CONF
    need SRPD_CEPH_POOL
    need SRPD_CEPH_IMAGE
    lun="{id: 0, backend: rbd, block_size: 512, rbd: {cluster_config: $SRPD_CEPH_CONF, pool: $SRPD_CEPH_POOL, image: $SRPD_CEPH_IMAGE}}"
  fi
  if [ "${1:-}" = alua ]; then
    lun="{id: 0, backend: file, path: $DIR/lun0.img, create: true, size: ${SRPD_INTEROP_LUN_MIB:-64}MiB, naa: ${SRPD_INTEROP_NAA:-6001405abcdef0123456789abcdef012}}"
    alua="
    alua:
      group: 1
      relative_port: 1
      state: active/optimized
      peers:
        - {group: 2, relative_ports: [2], state: active/non-optimized}"
  fi
  # keepalive_interval 200ms: idle channels are probed with zero-length RDMA WRITEs after
  # 50 ms of idleness, which the guest's rxe must acknowledge (else the channel is torn down and
  # the I/O fails); the capture then has them for tshark too.
  { common_conf; cat <<CONF
targets:
  - name: interop
    port_id: 0x$PORT_ID
    cm_port: $CM_PORT
    luns:
      - $lun
    acls:
      - initiator: "*"
    limits:
      keepalive_interval: 200ms$alua
CONF
  } > "$CONF"
  say "srpd -c $CONF:"; sed 's/^/  /' "$CONF" >&2
}

# sessions_with_writes N: how many sessions srpd shows with more than N bytes written to them.
sessions_with_writes() {
  "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 5s -o json session list 2>/dev/null |
    grep -o '"write_bytes": *[0-9]*' | awk -F: -v n="$1" '$2 > n { k++ } END { print k + 0 }'
}

# start_until_written N: start srpd (spid; SIGTERM and SIGINT are passed on) and wait until a
# session has had more than N bytes written through it.
start_until_written() {
  "$SRPD" -c "$CONF" --drain-timeout 3s &
  spid=$!
  trap 'kill -TERM "$spid" 2>/dev/null || true; wait "$spid"; exit $?' TERM INT
  for i in $(seq 1 1500); do
    [ "$(sessions_with_writes "$1")" -ge 1 ] && return 0
    kill -0 "$spid" 2>/dev/null || die "srpd exited before the kernel wrote through it"
    sleep 0.2
  done
  die "no session with more than $1 bytes written after 300 s"
}

# sessions: how many sessions srpd shows.
sessions() {
  "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 5s -o json session list 2>/dev/null | grep -c '"initiator"' || true
}

case $ROLE in
target)
  target_conf
  # The harness gives SIGTERM 5 s before SIGKILL: drain within 3 s.
  exec "$SRPD" -c "$CONF" --drain-timeout 3s
  ;;
target-rbd)
  # The harness runs this inside its network namespace: the Ceph cluster is started here, on
  # the namespace's loopback, and stopped when srpd has stopped (or by the cluster's owner
  # watcher, should this script be killed: CEPH_CLUSTER_OWNER).
  ip link set lo up 2>/dev/null || true
  CEPHDIR=$(mktemp -d /tmp/srpd-interop-ceph.XXXXXX)
  cephenv=$(CEPH_CLUSTER_OWNER=$$ CEPH_IMAGE_SIZE=${SRPD_INTEROP_LUN_MIB:-64}M "$REPO/scripts/ceph-cluster.sh" start "$CEPHDIR") ||
    die "the Ceph cluster did not start"
  eval "$cephenv"
  target_conf rbd
  "$SRPD" -c "$CONF" --drain-timeout 2s &
  spid=$!
  trap 'kill -TERM "$spid" 2>/dev/null || true; wait "$spid"; rc=$?; "$REPO/scripts/ceph-cluster.sh" stop "$CEPHDIR" >&2 || true; exit $rc' TERM INT
  rc=0
  wait "$spid" || rc=$?
  "$REPO/scripts/ceph-cluster.sh" stop "$CEPHDIR" >&2 || true
  exit "$rc"
  ;;
target-restart)
  # As target, but srpd is SIGKILLed once the kernel has written through its session and
  # started again from the same configuration: its state file (beside the control socket)
  # names the kernel's connections, and the new srpd sends each a DREQ, so ib_srp reconnects
  # after its reconnect_delay (10 s by default) instead of through SCSI timeouts and resets
  # (about 110 s). The guest's workload must pass across the outage.
  [ -x "$SRPCTL" ] || die "target-restart needs srpctl ($SRPCTL)"
  rm -f "$DIR/lun0.img"
  target_conf file
  start_until_written "${SRPD_INTEROP_KILL_AFTER_BYTES:-0}"
  kill -KILL "$spid"
  wait "$spid" 2>/dev/null || true
  killed=$(date +%s.%N)
  say "RESTART: srpd SIGKILLed during the kernel's I/O; starting it again"
  "$SRPD" -c "$CONF" --drain-timeout 3s &
  spid=$!
  for i in $(seq 1 600); do
    [ "$(sessions)" -ge 1 ] && break
    kill -0 "$spid" 2>/dev/null || die "the restarted srpd exited"
    [ "$i" -lt 600 ] || die "the kernel did not log in again within 120 s of the restart"
    sleep 0.2
  done
  say "RESTART: the kernel logged in again $(awk -v a="$killed" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the SIGKILL"
  wait "$spid"
  ;;
target-addlun)
  # As target, and once the kernel has written through its session, LUN 1 (16 MiB RAM) is
  # added with srpctl while the session stays logged in: the kernel gets REPORTED LUNS DATA HAS
  # CHANGED and finds the LUN on a scan (the guest's live_lun_check, LIVE_LUN_WAIT_S).
  [ -x "$SRPCTL" ] || die "target-addlun needs srpctl ($SRPCTL)"
  target_conf
  start_until_written 0
  "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 10s lun add interop 1 --backend ram --size 16MiB >&2 ||
    die "srpctl lun add failed"
  say "LIVE: LUN 1 added while the kernel's session is logged in"
  "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 10s session list >&2 || true
  wait "$spid"
  ;;
target-alua)
  # A fresh sparse file every run: only what the kernel writes is allocated.
  rm -f "$DIR/lun0.img"
  target_conf alua
  "$SRPD" -c "$CONF" --check >&2 || die "srpd --check refused the configuration"
  exec "$SRPD" -c "$CONF" --drain-timeout 3s
  ;;
initiator)
  need SRP_INTEROP_TARGET_ADDR
  { common_conf; cat <<CONF
sessions:
  - name: kernel
    address: $SRP_INTEROP_TARGET_ADDR
    port: $CM_PORT
    target_port_id: 0x$PORT_ID
    nbd:
      - {lun: 0, socket: $DIR/lun0.nbd}
CONF
  } > "$CONF"
  say "srpd -c $CONF:"; sed 's/^/  /' "$CONF" >&2
  rm -f "$DIR/lun0.nbd"
  # srpd's log goes to stderr as it comes, and to srpd.log for the logout check below.
  "$SRPD" -c "$CONF" --drain-timeout 10s 2> >(tee "$DIR/srpd.log" >&2) &
  spid=$!
  trap 'kill -TERM "$spid" 2>/dev/null || true' EXIT
  # The export appears once the session has logged in (srpd retries a failed login).
  for i in $(seq 1 450); do
    [ -S "$DIR/lun0.nbd" ] && break
    kill -0 "$spid" 2>/dev/null || die "srpd exited before its NBD export was up"
    [ "$i" -lt 450 ] || die "no NBD export after 90 s (login to $SRP_INTEROP_TARGET_ADDR:$CM_PORT failed?)"
    sleep 0.2
  done
  [ -x "$SRPCTL" ] && "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 10s connections >&2 || true
  nrc=0
  "$NBDCHECK" -socket "$DIR/lun0.nbd" -passes 2 -unaligned -size "${SRP_INTEROP_LUN_BYTES:-0}" -wait 10s -timeout 60s \
    > "$DIR/checks" || nrc=$?
  awk '$1 == "CHECK" { printf "SRP_INTEROP_SHA256=%s OFFSET=%s LEN=%s\n", $2, $3, $4 }' "$DIR/checks"
  [ -x "$SRPCTL" ] && "$SRPCTL" --socket "$DIR/srpd.sock" --timeout 10s connections kernel >&2 || true
  # Logout: srpd drains the export and logs the session out on SIGTERM.
  kill -TERM "$spid"
  src=0
  for i in $(seq 1 75); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$spid" 2>/dev/null; then
    kill -KILL "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    die "srpd did not stop within 15 s of SIGTERM"
  fi
  wait "$spid" || src=$?
  trap - EXIT
  [ "$nrc" -eq 0 ] || die "nbdcheck exit $nrc"
  [ "$src" -eq 0 ] || die "srpd exit $src"
  if grep -qE 'logout did not finish in time|disconnect did not finish in time' "$DIR/srpd.log"; then
    die "the session did not log out cleanly"
  fi
  grep -q 'disconnected' "$DIR/srpd.log" || die "srpd did not report the session's logout"
  say "OK: srpd logged in to $SRP_INTEROP_TARGET_ADDR:$CM_PORT, nbdcheck passed through its NBD export, srpd logged out and exited 0"
  ;;
*)
  usage
  ;;
esac
