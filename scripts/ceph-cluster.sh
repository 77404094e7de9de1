#!/usr/bin/env bash
# A throw-away Ceph cluster for tests: one monitor on 127.0.0.1 (a free port), one OSD on
# memstore (RAM, no disk), no authentication, pool "rbd" (size 1, 8 PGs) with one image. Every
# file it makes (config, keyring, monitor and OSD data, logs, pid files, admin sockets) is under
# DIR; nothing runs under systemd and nothing is written elsewhere.
#
#   scripts/ceph-cluster.sh start [DIR]   make DIR (mktemp -d if omitted; must not exist or be
#                                         empty), start the cluster, print its environment
#   scripts/ceph-cluster.sh env DIR       print the environment of a running cluster
#   scripts/ceph-cluster.sh stop DIR      kill the cluster's daemons (by their recorded PIDs
#                                         only) and remove DIR; a no-op if DIR is gone
#
# The environment (also in DIR/env, for `. DIR/env` or `eval "$(... env DIR)"`):
#   CEPH_CONF            DIR/ceph.conf (the ceph, rados and rbd tools read it from there)
#   SRPD_CEPH_DIR        DIR
#   SRPD_CEPH_CONF       DIR/ceph.conf, for the rbd backend's cluster_config
#   SRPD_CEPH_CLIENT     client.admin
#   SRPD_CEPH_KEYRING    DIR/keyring (unused by the cluster: auth is none)
#   SRPD_CEPH_POOL       rbd
#   SRPD_CEPH_IMAGE      srpd-test (CEPH_IMAGE_SIZE, default 64M)
#
# With CEPH_CLUSTER_OWNER=PID in the environment of start, a watcher (its PID in DIR/watch.pid)
# stops the cluster once process PID is gone: a test binary that starts a cluster and dies
# before stopping it (a go test timeout) leaves nothing behind either.
#
# Needs the Debian packages ceph-mon ceph-osd ceph-common (16.2 pacific). Every wait is bounded
# (CEPH_START_TIMEOUT seconds for the whole start, default 60); a start that fails prints the
# daemons' log tails to stderr, stops what it started and removes DIR. Progress goes to stderr,
# the environment alone to stdout.
set -euo pipefail

CEPH_START_TIMEOUT=${CEPH_START_TIMEOUT:-60}
CEPH_IMAGE_SIZE=${CEPH_IMAGE_SIZE:-64M}
marker=.srpd-ceph-cluster

say() { echo "ceph-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need_tools() {
  local t missing=""
  for t in ceph ceph-mon ceph-osd ceph-authtool monmaptool rbd ss timeout; do
    command -v "$t" >/dev/null 2>&1 || missing="$missing $t"
  done
  if [ -n "$missing" ]; then
    die "missing:$missing (apt-get install ceph-mon ceph-osd ceph-common iproute2 coreutils)"
  fi
}

# free_port prints a TCP port on 127.0.0.1 nobody listens on (from a random start, so that
# concurrent clusters rarely race for the same one).
free_port() {
  local p i
  p=$((20000 + RANDOM % 20000))
  for ((i = 0; i < 200; i++)); do
    if [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ]; then
      echo "$p"
      return 0
    fi
    p=$((p + 1))
  done
  die "no free TCP port found near $p"
}

# deadline_left prints the seconds left before the start deadline (at least 1 while any are).
deadline_left() {
  local left=$((deadline - SECONDS))
  [ "$left" -gt 0 ] || return 1
  echo "$left"
}

# bounded COMMAND...: runs COMMAND, killed at the start deadline.
bounded() {
  local left
  left=$(deadline_left) || die "start timed out after ${CEPH_START_TIMEOUT}s (before: $*)"
  timeout "$left" "$@"
}

# cephcmd runs the ceph CLI against the cluster, bounded by the start deadline.
cephcmd() {
  local left
  left=$(deadline_left) || die "start timed out after ${CEPH_START_TIMEOUT}s (before: ceph $*)"
  timeout "$left" ceph -c "$conf" --connect-timeout "$left" "$@"
}

# wait_for DESCRIPTION COMMAND...: retries COMMAND every 0.2 s until it succeeds or the start
# deadline passes.
wait_for() {
  local what=$1
  shift
  until "$@" >/dev/null 2>&1; do
    deadline_left >/dev/null || die "timed out after ${CEPH_START_TIMEOUT}s waiting for $what"
    sleep 0.2
  done
}

# alive DIR NAME: the process NAME (mon.a, osd.0, watch) whose PID is in DIR/NAME.pid runs, and
# is ours (a daemon's command line names DIR's config, the watcher's this script), so that a
# recycled PID is never taken for it.
alive() {
  local pidf=$1/$2.pid pid mark=$1/ceph.conf
  [ "$2" = watch ] && mark=ceph-cluster.sh
  [ -s "$pidf" ] || return 1
  pid=$(cat "$pidf")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$mark"
}

# spawn NAME COMMAND...: starts a daemon in the foreground mode (-f) in the background and
# records its PID in DIR/NAME.pid; its output goes to DIR/log/NAME.out.
spawn() {
  local name=$1
  shift
  "$@" </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/$name.pid"
}

osd_up() {
  cephcmd osd dump 2>/dev/null | grep -q '^osd\.0 up'
}

image_ok() {
  timeout 10 rbd -c "$conf" info "rbd/srpd-test" >/dev/null
}

write_env() {
  cat >"$dir/env" <<EOF
export CEPH_CONF=$dir/ceph.conf
export SRPD_CEPH_DIR=$dir
export SRPD_CEPH_CONF=$dir/ceph.conf
export SRPD_CEPH_CLIENT=client.admin
export SRPD_CEPH_KEYRING=$dir/keyring
export SRPD_CEPH_POOL=rbd
export SRPD_CEPH_IMAGE=srpd-test
EOF
}

start() {
  need_tools
  if [ -n "${1:-}" ]; then
    dir=$1
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
      die "$dir exists and is not empty"
    fi
    mkdir -p "$dir"
  else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ceph-cluster.XXXXXX")
  fi
  dir=$(cd "$dir" && pwd -P)
  touch "$dir/$marker"
  conf=$dir/ceph.conf
  deadline=$((SECONDS + CEPH_START_TIMEOUT))
  local t0=$SECONDS
  ok=0 # global: the EXIT trap reads it after start returns
  # Whatever goes wrong (an error, a timeout, an interrupt), nothing stays behind.
  trap 'if [ $ok = 0 ]; then failed; fi' EXIT
  trap 'exit 130' INT TERM

  mkdir -p "$dir/log" "$dir/run" "$dir/mon.a" "$dir/osd.0" "$dir/crash"
  local port fsid osd_uuid
  port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$conf" <<EOF
# Written by scripts/ceph-cluster.sh: a throw-away test cluster, everything under $dir.
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir/run
crash dir = $dir/crash
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
admin socket = $dir/run/\$name.asok
mon data = $dir/mon.\$id
osd data = $dir/osd.\$id
osd objectstore = memstore
# A client that dies without closing its watches (a SIGKILLed gateway holding an RBD image's
# exclusive lock) is dropped after this many seconds (default 30): the other gateway of a
# multipath pair can take the lock over that much sooner (cmd/srpd TestRBDMultipathFailover).
osd client watch timeout = 5
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd crush update on start = false
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# Tests on a full disk still run: the monitor neither warns nor stops for free space.
mon data avail warn = 1
mon data avail crit = 0
osd op num shards = 2
osd op num threads per shard = 1

[client]
# Several clients per process (tests open many connections): no admin socket, one log.
admin socket =
log file = $dir/log/client.log
EOF
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mgr 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
  bounded ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" \
    --keyring "$dir/keyring" >>"$dir/log/mon.a.out" 2>&1
  spawn mon.a ceph-mon -c "$conf" -f -i a
  say "mon.a on 127.0.0.1:$port (pid $(cat "$dir/mon.a.pid"))"
  wait_for "the monitor" cephcmd mon stat

  local id
  id=$(cephcmd osd create "$osd_uuid")
  [ "$id" = 0 ] || die "ceph osd create gave id '$id', want 0"
  bounded ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" \
    >>"$dir/log/osd.0.out" 2>&1
  cephcmd osd crush add osd.0 1.0 root=default >/dev/null 2>&1
  spawn osd.0 ceph-osd -c "$conf" -f -i 0
  say "osd.0 (memstore) pid $(cat "$dir/osd.0.pid")"
  wait_for "osd.0 up" osd_up

  cephcmd osd pool create rbd 8 >/dev/null 2>&1
  bounded rbd -c "$conf" pool init rbd
  bounded rbd -c "$conf" create --size "$CEPH_IMAGE_SIZE" rbd/srpd-test
  wait_for "image rbd/srpd-test" image_ok
  alive "$dir" mon.a || die "mon.a exited"
  alive "$dir" osd.0 || die "osd.0 exited"

  write_env
  if [ -n "${CEPH_CLUSTER_OWNER:-}" ]; then
    watch_owner "$CEPH_CLUSTER_OWNER" </dev/null >>"$dir/log/watch.out" 2>&1 &
    echo $! >"$dir/watch.pid"
  fi
  ok=1
  trap - EXIT INT TERM
  say "up in $((SECONDS - t0)) s: $dir (stop with: $0 stop $dir)"
  cat "$dir/env"
}

# watch_owner PID (in the background, fds away from the caller's pipes): stop the cluster once
# PID has exited.
watch_owner() {
  trap - EXIT INT TERM
  while kill -0 "$1" 2>/dev/null; do sleep 1; done
  say "owner $1 is gone: stopping the cluster"
  stop "$dir"
}

# failed runs when start did not finish: the logs' tails, then stop.
failed() {
  set +e
  say "start failed; log tails follow"
  local f
  for f in "$dir"/log/*; do
    [ -f "$f" ] || continue
    echo "==> $f <==" >&2
    tail -n 25 "$f" >&2
  done
  stop "$dir"
}

# stop kills the daemons whose PIDs DIR records (TERM, then KILL after 10 s), waits until they
# are gone, and removes DIR. It refuses a DIR this script did not make.
stop() {
  local d=$1 name pid i
  [ -e "$d" ] || return 0
  [ -f "$d/$marker" ] || die "$d was not made by $0: not touching it"
  d=$(cd "$d" && pwd -P)
  # The owner watcher first (unless this is it), so that it does not race this stop.
  if [ -s "$d/watch.pid" ] && [ "$(cat "$d/watch.pid")" != "$BASHPID" ] && alive "$d" watch; then
    kill -TERM "$(cat "$d/watch.pid")" 2>/dev/null || true
  fi
  for name in osd.0 mon.a; do
    if alive "$d" "$name"; then
      pid=$(cat "$d/$name.pid")
      kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do
        alive "$d" "$name" || break
        sleep 0.1
      done
      if alive "$d" "$name"; then
        say "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
          alive "$d" "$name" || break
          sleep 0.1
        done
      fi
      alive "$d" "$name" && die "$name (pid $pid) is still running; leaving $d in place"
    fi
  done
  rm -rf "$d"
  say "stopped; removed $d"
}

case ${1:-} in
start) start "${2:-}" ;;
stop)
  [ -n "${2:-}" ] || usage
  stop "$2"
  ;;
env)
  [ -n "${2:-}" ] || usage
  [ -f "$2/env" ] || die "no cluster in $2"
  cat "$2/env"
  ;;
*) usage ;;
esac
