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

# common_conf: the transport, the control socket and the logs (both roles).
common_conf() {
  cat <<CONF
version: 1
transports:
  - name: bridge
    driver: softroce
    address: $SRP_INTEROP_ADDR
    udp_port: $ROCE_PORT
control:
  socket: $DIR/srpd.sock
  mode: "0600"
logging:
  level: info
  format: console
CONF
}

case $ROLE in
target)
  # keepalive_interval 200ms: idle channels are probed with zero-length RDMA WRITEs after
  # 50 ms of idleness, which the guest's rxe must acknowledge (else the channel is torn down and
  # the I/O fails); the capture then has them for tshark too.
  { common_conf; cat <<CONF
targets:
  - name: interop
    port_id: 0x$PORT_ID
    cm_port: $CM_PORT
    luns:
      - {id: 0, backend: ram, size: ${SRPD_INTEROP_LUN_MIB:-64}MiB}
    acls:
      - initiator: "*"
    limits:
      keepalive_interval: 200ms
CONF
  } > "$CONF"
  say "srpd -c $CONF:"; sed 's/^/  /' "$CONF" >&2
  # The harness gives SIGTERM 5 s before SIGKILL: drain within 3 s.
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
