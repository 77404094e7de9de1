#!/usr/bin/env bash
# make bench: srpd's NBD export of a remote LUN against qemu-nbd and nbdkit (over unix sockets
# and over TCP), the same across a veth pair into a network namespace ("two hosts"), softroce's
# RDMA streams against a TCP stream, and the target's memory with 1 and 64 sessions.
#
# Section "nbd": NBD servers of the same size, filled with the same random data:
#   ours      bench/cmd/srpbench nbd -local: one process, as srpd runs its loopback demo
#             (configs/demo-loopback.yaml): an SRP target (RAM LUN) and an SRP initiator that
#             logs in to it over softroce (RDMA CM, 2 channels) on one softroce device, serving
#             LUN 0 with package initiator/nbd. Their packets take softroce's loopback path, as
#             between two QPs of one kernel rxe device (rxe_loopback), not the UDP socket;
#   ours-2proc  the same as two processes (srpbench target, srpbench nbd) on two softroce
#             devices: RoCEv2 over the kernel's UDP loopback;
#   qemu-nbd  a raw file on /dev/shm (--cache=none --aio=threads), on a unix socket;
#   nbdkit    the memory plugin (4 threads), on a unix socket;
#   qemu-nbd-tcp, nbdkit-tcp  the same two over TCP on 127.0.0.1 (qemu-nbd -b ADDR -p PORT,
#             nbdkit -i ADDR -p PORT; ports below the ephemeral range, checked free and
#             retried if another process takes one first), as a user compares them.
# Our NBD exports are on unix sockets in a private directory on tmpfs (fio → our initiator is
# one hop more than fio → a TCP server: ours-2proc pays it anyway). The same fio jobs (nbd
# engine) run against each in turn: 128 KiB sequential read and write and 4 KiB random read,
# at queue depth 32 and 1. The tables give MiB/s or IOPS, the mean and p99 completion latency
# of 4 KiB random reads, the CPU time per I/O of each server's processes, and the ratio of each
# of our set-ups to each baseline (for latency: ours/other, lower is better).
#
# Section "netns" ("two hosts"; root): the target process of ours-2proc and the TCP servers
# qemu-nbd-tcp and nbdkit-tcp run in a network namespace of their own behind a veth pair that
# the script creates (names and a private 10.213.x.y/30 unique to this run, checked unused) and
# removes at exit; our initiator + NBD process and fio stay in the root namespace. Once per MTU
# of NETNS_MTUS (veth MTU 9000: RoCE path MTU 4096; 1500: 1024, as rxe derives it, iboe_get_mtu;
# passed to both softroce devices with -mtu). It runs the nbd comparison with those servers and
# the rdma section's streams (NETNS_PARTS). Without root, or where namespaces cannot be made, it
# prints "SKIPPED: ..." and the other sections go on.
#
# Section "rdma": softroce's RDMA WRITE and RDMA READ streams between two processes (srpbench
# rdma against srpbench rdma-server: one RC QP, RDMA CM) beside a TCP stream of the same bytes
# between two processes (srpbench rdma against srpbench tcp-server: each message acknowledged
# once received, or requested, with as many in flight as the RDMA queue depth), interleaved in
# one run: GB/s, softroce/TCP, and the CPU seconds per GB of each side.
#
# Section "mem": a target process with queue depth 128; `srpbench mem` logs in S sessions of 2
# channels each, fills the LUN, warms up (every channel at its full queue depth with the
# largest I/O size of the mix), then runs random I/O (4-64 KiB, reads and writes): N = MEM_IOS
# I/Os, then 9N more. It prints the target's VmRSS (/proc/PID/status) before the logins, after
# them (and the fill), after the warm-up, after N and after 10N I/Os, with the memory the target
# registered per channel (the bound of what the request slots can touch: queue depth + 1 slots
# of data buffer, IU buffers and descriptor tables). Once for each S in MEM_SESSIONS, each time
# with a fresh target process.
#
#   bench/bench.sh                # every section: nbd rdma netns mem (make bench)
#   bench/bench.sh nbd            # make bench-nbd
#   bench/bench.sh rdma           # make bench-rdma
#   bench/bench.sh netns          # make bench-netns (root)
#   bench/bench.sh mem            # make bench-mem
#   RUNTIME=5 SIZE=256m bench/bench.sh nbd
#   REPEAT=3 bench/bench.sh nbd   # three interleaved rounds, medians in the summary
#   SERVERS="ours-2proc nbdkit-tcp qemu-nbd-tcp" bench/bench.sh nbd netns
#   PROFILE=1 bench/bench.sh nbd  # CPU profiles of our processes, top functions printed
#
# Environment: RUNTIME (s per fio job, 10), REPEAT (rounds of all jobs, interleaved, every other
# one with the servers in reverse order; the summary gives medians; 1), RAMP (s, 1), SIZE
# (export size, 1g), QDS ("32 1"), JOBS (words; only the jobs whose name contains one of them,
# e.g. "randread 128k-qd1"; default all),
# CHANNELS (2), INI_QD (initiator queue depth per channel, 64), OURS (our set-ups, each run in
# the same run as its own processes: MODE[:GOMAXPROCS], MODE local (column ours), localcopy
# (column ours-copy: local with the NBD buffers on the Go heap, copied through the initiator's
# slot buffers, as before direct Buffers) or split (column ours-2proc), GOMAXPROCS N adds -gmpN to the column (default: Go's, the number of CPUs); MODE/qN gives
# our processes N softroce receive queues (config transport queues; column -qN, e.g.
# OURS="split split/q2" for the multi-queue A/B); default
# "local split"; MODE[:GOMAXPROCS]+FLAG[+FLAG] passes FLAGs to the NBD process, column -xN),
# SERVERS (the columns to run, among OURS's and qemu-nbd nbdkit qemu-nbd-tcp nbdkit-tcp;
# default all; in netns only split set-ups and the TCP servers run),
# PROFILE, PROFILE_DIR
# (where to keep the profiles; default: the work directory, removed at exit), MEM_SESSIONS ("1 64"),
# MEM_QD (128), MEM_IOS (N, 20000), MEM_LUN (64m), MEM_SIZES ("4k,4k,16k,64k"), MEM_WORKERS
# (I/O goroutines per session, 0: channels × qd / 2), MEM_GOMAXPROCS (of the target; default Go's),
# RDMA_OPS ("write,read"), RDMA_SIZES ("64k,256k,1m"), RDMA_QDS ("1,16"; at most 16), RDMA_TIME
# (s per stream; RUNTIME), RDMA_WARMUP (s before each stream is measured, 0.5),
# NETNS_MTUS ("9000 1500"), NETNS_PARTS ("nbd rdma"), BENCH_B (a git revision: OURS entries
# MODE@b run srpbench built from it, column -b, for an A/B of two commits in one run, e.g.
# BENCH_B=7251021 OURS="local local@b split split@b"; on loopback only, and without the -addr
# and -mtu flags, which older srpbench builds do not have).
# Needs: go, fio, qemu-nbd (qemu-utils), nbdkit, nbdcopy and nbdinfo (libnbd-bin), jq, openssl,
# ip and ss (iproute2); as root with apt-get the missing Debian packages are installed
# (BENCH_INSTALL=0: don't).
# Only the processes this script starts are stopped, by PID; every wait is bounded.
set -euo pipefail

RUNTIME=${RUNTIME:-10}
REPEAT=${REPEAT:-1}
RAMP=${RAMP:-1}
SIZE=${SIZE:-1g}
QDS=${QDS:-"32 1"}
JOBS=${JOBS:-}
CHANNELS=${CHANNELS:-2}
INI_QD=${INI_QD:-64}
OURS=${OURS:-"local split"}
SERVERS=${SERVERS:-}
PROFILE=${PROFILE:-}
MEM_SESSIONS=${MEM_SESSIONS:-"1 64"}
MEM_QD=${MEM_QD:-128}
MEM_IOS=${MEM_IOS:-20000}
MEM_LUN=${MEM_LUN:-64m}
MEM_SIZES=${MEM_SIZES:-4k,4k,16k,64k}
MEM_WORKERS=${MEM_WORKERS:-0}
MEM_GOMAXPROCS=${MEM_GOMAXPROCS:-}
RDMA_OPS=${RDMA_OPS:-write,read}
RDMA_SIZES=${RDMA_SIZES:-64k,256k,1m}
RDMA_QDS=${RDMA_QDS:-1,16}
RDMA_TIME=${RDMA_TIME:-$RUNTIME}
RDMA_WARMUP=${RDMA_WARMUP:-0.5}
NETNS_MTUS=${NETNS_MTUS:-"9000 1500"}
NETNS_PARTS=${NETNS_PARTS:-"nbd rdma"}
BENCH_INSTALL=${BENCH_INSTALL:-1}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
sections=("$@")
[[ ${#sections[@]} -gt 0 ]] || sections=(nbd rdma netns mem)
for s in "${sections[@]}"; do
  case $s in nbd | rdma | netns | mem) ;; *) echo "bench.sh: unknown section $s (nbd, rdma, netns, mem)" >&2; exit 2 ;; esac
done
want() { local s; for s in "${sections[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
for p in $NETNS_PARTS; do
  [[ $p == nbd || $p == rdma ]] || { echo "bench.sh: NETNS_PARTS: unknown part $p (nbd, rdma)" >&2; exit 2; }
done
netns_wants() { [[ " $NETNS_PARTS " == *" $1 "* ]]; }

# Our set-ups, from OURS: spec (MODE[:GOMAXPROCS][+FLAG...]) by column name, in order.
declare -A our_spec=()
our_cols=()
nx=0
for spec in $OURS; do
  base=${spec%%+*}
  mode=${base%%:*}
  q=""
  if [[ $mode == */q* ]]; then
    q=${mode##*/q}
    mode=${mode%/q*}
    [[ $q =~ ^[0-9]+$ && $q -ge 1 ]] || { echo "bench.sh: OURS entry $spec: /qN needs a queue count" >&2; exit 2; }
  fi
  mode=${mode%@b}
  case $mode in
    local) col="ours" ;;
    localcopy) col="ours-copy" ;;
    split) col="ours-2proc" ;;
    *) echo "bench.sh: OURS entry $spec: mode must be local, localcopy or split" >&2; exit 2 ;;
  esac
  [[ -n $q ]] && col+=-q$q
  [[ $base == *:* ]] && col+=-gmp${base#*:}
  if [[ $base == *@b* ]]; then
    [[ -n ${BENCH_B:-} ]] || { echo "bench.sh: OURS entry $spec needs BENCH_B (a git revision)" >&2; exit 2; }
    col+=-b
  fi
  if [[ $spec == *+* ]]; then
    nx=$((nx + 1))
    col+=-x$nx
  fi
  [[ -z ${our_spec[$col]:-} ]] || { echo "bench.sh: OURS has $col twice" >&2; exit 2; }
  our_spec[$col]=$spec
  our_cols+=("$col")
done
baselines=(qemu-nbd nbdkit qemu-nbd-tcp nbdkit-tcp)
if [[ -n $SERVERS ]]; then
  for s in $SERVERS; do
    if [[ -z ${our_spec[$s]:-} && " ${baselines[*]} " != *" $s "* ]]; then
      echo "bench.sh: SERVERS: $s is neither one of OURS's columns (${our_cols[*]}) nor a baseline (${baselines[*]})" >&2
      exit 2
    fi
  done
fi
# shellcheck disable=SC2317 # false positive of shellcheck 0.9: called from nbd_compare
selected() { [[ -z $SERVERS || " $SERVERS " == *" $1 "* ]]; }

# The Debian package of each tool the sections use.
declare -A pkg_of=([fio]=fio [qemu-nbd]=qemu-utils [nbdkit]=nbdkit [nbdcopy]=libnbd-bin
  [nbdinfo]=libnbd-bin [jq]=jq [openssl]=openssl [ip]=iproute2 [ss]=iproute2)
tools=(go jq)
if want nbd || { want netns && netns_wants nbd; }; then tools+=(fio qemu-nbd nbdkit nbdcopy nbdinfo openssl ss); fi
want netns && tools+=(ip)
missing=()
for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [[ ${#missing[@]} -gt 0 && $BENCH_INSTALL != 0 && $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
  declare -A want_pkgs=()
  for tool in "${missing[@]}"; do [[ -n ${pkg_of[$tool]:-} ]] && want_pkgs[${pkg_of[$tool]}]=1; done
  if [[ ${#want_pkgs[@]} -gt 0 ]]; then
    echo "== installing ${!want_pkgs[*]} (missing: ${missing[*]}; BENCH_INSTALL=0 not to)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -qq || true
    timeout 1200 apt-get install -y -qq --no-install-recommends "${!want_pkgs[@]}" || true
  fi
fi
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "bench.sh: $tool not found${pkg_of[$tool]:+ (Debian package ${pkg_of[$tool]})}" >&2; exit 1; }
done

work=$(mktemp -d /dev/shm/srpbench.XXXXXX)
pids=()
# stop PID...: SIGTERM, then wait (bounded: 15 s) and SIGKILL what is left. Only PIDs this
# script started are ever passed here.
stop() {
  local p n
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for n in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "bench.sh: process $p did not stop in 15 s; killing it" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
}
forget() { # PID...: drop from the cleanup list
  local p q keep=()
  for q in "${pids[@]}"; do
    for p in "$@"; do [[ $q == "$p" ]] && continue 2; done
    keep+=("$q")
  done
  pids=("${keep[@]}")
}
# The network namespace and veth pair of the netns section (empty: none made).
ns=""
veth_r=""
# netns_delete: remove the namespace and the veth pair, if made (bounded; also at exit).
# shellcheck disable=SC2317 # also called by cleanup from the EXIT trap
netns_delete() {
  if [[ -n $veth_r ]]; then timeout 10 ip link del "$veth_r" 2>/dev/null || true; fi
  if [[ -n $ns ]]; then timeout 10 ip netns del "$ns" 2>/dev/null || true; fi
  ns=""
  veth_r=""
  nsexec=()
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  [[ ${#pids[@]} -gt 0 ]] && stop "${pids[@]}"
  netns_delete
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_file FILE WHAT PID: wait (bounded: 60 s) for FILE, failing early if PID died.
wait_file() {
  local n
  for n in $(seq 600); do
    [[ -s $1 ]] && return 0
    kill -0 "$3" 2>/dev/null || { echo "bench.sh: $2 exited; its log:" >&2; cat "$work/$2.log" >&2 || true; exit 1; }
    sleep 0.1
  done
  echo "bench.sh: $2 did not come up in 60 s" >&2
  exit 1
}
wait_nbd() { # URI
  local n
  for n in $(seq 300); do
    nbdinfo --can connect "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bench.sh: NBD server at $1 did not come up" >&2
  exit 1
}

echo "== building bench/cmd/srpbench"
(cd "$root" && go build -o "$work/srpbench" ./bench/cmd/srpbench)
bin=$work/srpbench
bin_b=
if [[ -n ${BENCH_B:-} ]]; then
  echo "== building bench/cmd/srpbench at $BENCH_B (OURS entries MODE@b)"
  mkdir -p "$work/b-src"
  git -C "$root" archive "$BENCH_B" | tar -x -C "$work/b-src"
  (cd "$work/b-src" && go build -o "$work/srpbench-b" ./bench/cmd/srpbench)
  bin_b=$work/srpbench-b
fi
pdir=${PROFILE_DIR:-$work}

# Where the servers run: the nbd and rdma comparisons run in the root namespace on loopback
# (place=loopback, both addresses 127.0.0.1), or with their servers in the netns section's
# namespace (place=netns: nsexec runs a command there, srv_addr is its end of the veth pair,
# ini_addr ours, pmtu the RoCE path MTU both softroce devices are given).
place=loopback
nsexec=()
srv_addr=127.0.0.1
ini_addr=127.0.0.1
pmtu=0
ns_mtu=""

# start_target NAME ARGS...: start a target process; sets tpid and tudp.
start_target() {
  local name=$1; shift
  rm -f "$work/$name.ready"
  env ${MEM_GOMAXPROCS:+GOMAXPROCS=$MEM_GOMAXPROCS} "$bin" target -ready "$work/$name.ready" "$@" >"$work/$name.log" 2>&1 &
  tpid=$!
  pids+=("$tpid")
  wait_file "$work/$name.ready" "$name" "$tpid"
  tudp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$work/$name.ready")
}


# ---------------------------------------------------------------------------------------------
# median LIST: the median of a space-separated list of numbers.
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { jq -n "if $2 == 0 then 0 else $1 / $2 end"; }
# ticks PID...: their CPU time (user + system, clock ticks) from /proc/PID/stat.
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }

# make_image: SIZE of random data on tmpfs, once per run (what every export is filled with).
make_image() {
  [[ -s $work/img.raw ]] && return 0
  echo "== image: $SIZE of random data in $work (tmpfs)"
  openssl rand -out "$work/img.raw" "$(numfmt --from=iec "${SIZE^^}")"
}

# wait_listen PID PORT: wait (bounded: 30 s) until process PID listens on TCP PORT (in the
# servers' namespace); fails if PID exits or does not listen in time (another process may have
# taken the port first: the caller retries with another).
wait_listen() {
  local n
  for n in $(seq 300); do
    kill -0 "$1" 2>/dev/null || return 1
    "${nsexec[@]}" ss -Htlnp "sport = :$2" 2>/dev/null | grep -q "pid=$1," && return 0
    sleep 0.1
  done
  return 1
}

# start_tcp_baseline NAME: qemu-nbd-tcp or nbdkit-tcp on srv_addr (in the servers' namespace)
# at a free port; sets uri[NAME] and cpupids[NAME] (the caller's).
start_tcp_baseline() {
  local name=$1 try port pid log=$work/$1.$place.log bytes
  bytes=$(numfmt --from=iec "${SIZE^^}")
  for try in 1 2 3 4 5; do
    port=$("${nsexec[@]}" "$bin" free-port -addr "$srv_addr")
    case $name in
      qemu-nbd-tcp)
        "${nsexec[@]}" qemu-nbd -b "$srv_addr" -p "$port" -x disk -f raw -t --cache=none --aio=threads \
          "$work/img.raw" >"$log" 2>&1 &
        ;;
      nbdkit-tcp)
        "${nsexec[@]}" nbdkit -f -i "$srv_addr" -p "$port" -e disk -t 4 memory "$bytes" >"$log" 2>&1 &
        ;;
    esac
    pid=$!
    pids+=("$pid")
    if wait_listen "$pid" "$port"; then
      uri[$name]="nbd://$srv_addr:$port/disk"
      cpupids[$name]=$pid
      return 0
    fi
    echo "bench.sh: $name did not come up on $srv_addr:$port (try $try of 5); its log:" >&2
    cat "$log" >&2 || true
    stop "$pid"
    forget "$pid"
  done
  echo "bench.sh: $name: giving up" >&2
  exit 1
}

# nbd_compare: the NBD comparison with the servers of the current place (loopback: every
# selected one; netns: the split set-ups and the TCP servers, in the namespace).
nbd_compare() {
  local name rw bs qd dir s out j g spec mode tag
  local bytes
  bytes=$(numfmt --from=iec "${SIZE^^}")
  make_image
  tag=$place
  [[ $place == netns ]] && tag=netns-mtu$ns_mtu

  # Ours, once per entry of OURS (MODE[:GOMAXPROCS]): "local" is one process with the SRP target
  # and the SRP initiator + NBD export on one softroce device, as srpd runs its loopback demo
  # (packets between them take softroce's loopback path, as between two QPs of one kernel rxe
  # device); "split" is a target process and an initiator + NBD process on two softroce devices,
  # whose packets cross the kernel's UDP loopback, or the veth pair into the servers' namespace.
  local -A uri=() cpupids=()
  local servers=() ourpids=() splits=() ours=() skipped=()
  for s in "${our_cols[@]}"; do
    selected "$s" || continue
    spec=${our_spec[$s]}
    # MODE[/qN][:GOMAXPROCS][+FLAG...]: FLAGs (e.g. +-read-spin=-1ns) go to the NBD process.
    local xflags=()
    if [[ $spec == *+* ]]; then
      IFS=+ read -r -a xflags <<<"${spec#*+}"
      spec=${spec%%+*}
    fi
    mode=${spec%%:*}
    g=default
    [[ $spec == *:* ]] && g=${spec#*:}
    # MODE/qN: N softroce receive queues in each of our processes (transport queues).
    local qflags=()
    if [[ $mode == */q* ]]; then
      qflags=(-queues "${mode##*/q}")
      mode=${mode%/q*}
    fi
    # MODE@b: srpbench built from BENCH_B, on loopback, without the flags it may not have.
    local sb=$bin netflags=(-addr "$srv_addr" -mtu "$pmtu") ininet=(-addr "$ini_addr" -mtu "$pmtu")
    if [[ $mode == *@b ]]; then
      mode=${mode%@b}
      sb=$bin_b netflags=() ininet=()
      if [[ $place == netns ]]; then
        skipped+=("$s")
        continue
      fi
    fi
    if [[ $place == netns && $mode == local* ]]; then
      skipped+=("$s")
      continue
    fi
    local bufflag=()
    [[ $mode == localcopy ]] && bufflag=(-heap-buffers)
    ((${#xflags[@]} > 0)) && echo "== $s: NBD process flags ${xflags[*]}"
    local genv=()
    [[ $g == default ]] || genv=("GOMAXPROCS=$g")
    local tprof=() iprof=()
    if [[ -n $PROFILE ]]; then
      mkdir -p "$pdir"
      tprof=(-cpuprofile "$pdir/$s.$tag.target.cpu.pprof")
      iprof=(-cpuprofile "$pdir/$s.$tag.initiator.cpu.pprof")
    fi
    local npid
    if [[ $mode == local* ]]; then
      echo "== starting $s: one process, SRP target + SRP initiator + NBD on one softroce device ($CHANNELS channels, QD $INI_QD, GOMAXPROCS $g)"
      env "${genv[@]}" "$sb" nbd -local -lun-size "$SIZE" -target-qd 128 -socket "$work/$s.sock" -ready "$work/$s.nbd.ready" \
        -channels "$CHANNELS" -qd "$INI_QD" "${qflags[@]}" "${bufflag[@]}" "${xflags[@]}" "${iprof[@]}" >"$work/$s.nbd.log" 2>&1 &
      npid=$!
      pids+=("$npid")
      wait_file "$work/$s.nbd.ready" "$s.nbd" "$npid"
      cpupids[$s]="$npid"
      ourpids+=("$npid")
    else
      echo "== starting $s: SRP target process$([[ $place == netns ]] && echo " (in namespace $ns at $srv_addr)"), SRP initiator + NBD process ($CHANNELS channels, QD $INI_QD, GOMAXPROCS $g)"
      rm -f "$work/$s.target.ready" "$work/$s.nbd.ready"
      "${nsexec[@]}" env "${genv[@]}" "$sb" target "${netflags[@]}" -ready "$work/$s.target.ready" -lun-size "$SIZE" -qd 128 \
        "${qflags[@]}" "${tprof[@]}" >"$work/$s.target.log" 2>&1 &
      tpid=$!
      pids+=("$tpid")
      wait_file "$work/$s.target.ready" "$s.target" "$tpid"
      tudp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$work/$s.target.ready")
      env "${genv[@]}" "$sb" nbd -target "$tudp" "${ininet[@]}" -socket "$work/$s.sock" -ready "$work/$s.nbd.ready" \
        -channels "$CHANNELS" -qd "$INI_QD" "${qflags[@]}" "${xflags[@]}" "${iprof[@]}" >"$work/$s.nbd.log" 2>&1 &
      npid=$!
      pids+=("$npid")
      wait_file "$work/$s.nbd.ready" "$s.nbd" "$npid"
      cpupids[$s]="$tpid $npid"
      ourpids+=("$tpid" "$npid")
      splits+=("$s")
    fi
    uri[$s]="nbd+unix:///disk?socket=$work/$s.sock"
    servers+=("$s")
    ours+=("$s")
  done
  local bases=()
  if [[ $place == loopback ]]; then
    selected qemu-nbd || selected nbdkit && echo "== starting$(selected qemu-nbd && echo " qemu-nbd")$(selected nbdkit && echo " nbdkit") on unix sockets"
    if selected qemu-nbd; then
      qemu-nbd -k "$work/qemu.sock" -x disk -f raw -t --cache=none --aio=threads "$work/img.raw" >"$work/qemu.log" 2>&1 &
      pids+=($!)
      cpupids[qemu-nbd]=$!
      uri[qemu-nbd]="nbd+unix:///disk?socket=$work/qemu.sock"
      bases+=(qemu-nbd)
    fi
    if selected nbdkit; then
      nbdkit -f -U "$work/nbdkit.sock" -e disk -t 4 memory "$bytes" >"$work/nbdkit.log" 2>&1 &
      pids+=($!)
      cpupids[nbdkit]=$!
      uri[nbdkit]="nbd+unix:///disk?socket=$work/nbdkit.sock"
      bases+=(nbdkit)
    fi
  else
    selected qemu-nbd && skipped+=(qemu-nbd)
    selected nbdkit && skipped+=(nbdkit)
  fi
  for s in qemu-nbd-tcp nbdkit-tcp; do
    selected "$s" || continue
    echo "== starting $s on $srv_addr$([[ $place == netns ]] && echo " (in namespace $ns)")"
    start_tcp_baseline "$s"
    bases+=("$s")
  done
  ((${#skipped[@]} == 0)) || echo "== not in this set-up (one process, or a unix socket): ${skipped[*]}"
  servers+=("${bases[@]}")
  ((${#servers[@]} > 0)) || { echo "== no server selected for $place (SERVERS=$SERVERS)"; return 0; }
  for s in "${servers[@]}"; do wait_nbd "${uri[$s]}"; done
  local fill=()
  for s in "${servers[@]}"; do [[ $s == qemu-nbd* ]] || fill+=("$s"); done
  if ((${#fill[@]} > 0)); then
    echo "== filling ${fill[*]} from the image (nbdcopy)"
    for s in "${fill[@]}"; do timeout 600 nbdcopy --flush "$work/img.raw" "${uri[$s]}"; done
  fi

  # The transport floor, in the same run: a 64-byte UDP request answered with 4 KiB + 64 bytes
  # between two Go processes (what an SRP read's SEND and RDMA WRITE + SEND cost at least),
  # across the same path as the split set-ups' packets.
  rm -f "$work/udp.ready"
  "${nsexec[@]}" "$bin" udp-echo -addr "$srv_addr" -ready "$work/udp.ready" -reply 4160 >"$work/udp.log" 2>&1 &
  local upid=$!
  pids+=("$upid")
  wait_file "$work/udp.ready" udp "$upid"
  local udpline udp_mean
  udpline=$("$bin" udp-ping -target "$(sed -n 's/udp=\([^ ]*\).*/\1/p' "$work/udp.ready")" -time "${RUNTIME}s")
  udp_mean=$(sed -n 's/.*mean_us=\([0-9.]*\).*/\1/p' <<<"$udpline")
  stop "$upid"
  forget "$upid"
  echo "udp round trip (2 Go processes, 64 B / 4160 B, $srv_addr): $udpline"

  # name rw bs qd unit
  local jobs=()
  for qd in $QDS; do
    jobs+=("seqread-128k-qd$qd read 128k $qd MiB/s" "seqwrite-128k-qd$qd write 128k $qd MiB/s" "randread-4k-qd$qd randread 4k $qd IOPS")
  done
  if [[ -n $JOBS ]]; then
    local keep=() pat
    for j in "${jobs[@]}"; do
      for pat in $JOBS; do [[ ${j%% *} == *"$pat"* ]] && { keep+=("$j"); break; }; done
    done
    [[ ${#keep[@]} -gt 0 ]] || { echo "bench.sh: JOBS=$JOBS matches no job" >&2; exit 2; }
    jobs=("${keep[@]}")
  fi
  local -A val=() lat=() p99=() cpu=() rval=() rlat=() rp99=() rcpu=()
  # Per process: cpu1 (the first of a set-up's processes: the target of a split set-up, the
  # server otherwise), cpu2 (a split set-up's initiator), fcpu (fio, the NBD client).
  local -A cpu1=() cpu2=() fcpu=() rcpu1=() rcpu2=() rfcpu=()
  local unit rep
  # REPEAT rounds of every job against every server, interleaved (the machine's load drifts
  # over minutes); the summary takes each figure's median over the rounds.
  local -a order
  local k
  for rep in $(seq 1 "$REPEAT"); do
    [[ $REPEAT -gt 1 ]] && echo "== round $rep of $REPEAT"
    # Every other round runs the servers in reverse order, so that in an A/B neither side
    # always runs first, or always right after the same one.
    order=("${servers[@]}")
    if ((rep % 2 == 0)); then
      order=()
      for ((k = ${#servers[@]} - 1; k >= 0; k--)); do order+=("${servers[k]}"); done
    fi
    for j in "${jobs[@]}"; do
      read -r name rw bs qd unit <<<"$j"
      dir="read"
      [[ $rw == *write* ]] && dir="write"
      for s in "${order[@]}"; do
        out="$work/$name.$s.json"
        local c0 c1 t0 t1 ios wall
        local -a cp
        read -r -a cp <<<"${cpupids[$s]}"
        c0=$(ticks "${cp[@]}")
        c1=$(ticks "${cp[0]}")
        t0=$(date +%s%N)
        timeout $((RUNTIME + RAMP + 60)) fio --name="$name" --ioengine=nbd --uri="${uri[$s]}" --rw="$rw" --bs="$bs" \
          --iodepth="$qd" --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
          --output-format=json --output="$out" >/dev/null
        t1=$(date +%s%N)
        if [[ $unit == IOPS ]]; then
          val[$name.$s]=$(jq -r ".jobs[0].$dir.iops" "$out")
        else
          val[$name.$s]=$(jq -r ".jobs[0].$dir.bw_bytes / 1048576" "$out")
        fi
        lat[$name.$s]=$(jq -r ".jobs[0].$dir.lat_ns.mean / 1000" "$out")
        p99[$name.$s]=$(jq -r ".jobs[0].$dir.clat_ns.percentile[\"99.000000\"] / 1000" "$out")
        # CPU time of the server's processes per I/O (ramp included: I/Os estimated from the
        # IOPS over the whole job's wall time).
        ios=$(jq -r ".jobs[0].$dir.iops" "$out")
        wall=$(jq -n "$ios * ($t1 - $t0) / 1e9") # I/Os over the job's wall time
        cpu[$name.$s]=$(jq -n "if $wall == 0 then 0 else ($(ticks "${cp[@]}") - $c0) / $(getconf CLK_TCK) * 1e6 / $wall end")
        cpu1[$name.$s]=$(jq -n "if $wall == 0 then 0 else ($(ticks "${cp[0]}") - $c1) / $(getconf CLK_TCK) * 1e6 / $wall end")
        cpu2[$name.$s]=$(jq -n "${cpu[$name.$s]} - ${cpu1[$name.$s]}")
        # fio's own CPU (usr_cpu and sys_cpu are percentages of its measured runtime).
        fcpu[$name.$s]=$(jq -r "if .jobs[0].$dir.iops == 0 then 0 else (.jobs[0].usr_cpu + .jobs[0].sys_cpu) * 1e4 / .jobs[0].$dir.iops end" "$out")
        printf '%-20s %-12s %10.1f %-5s  mean %9.1f us  p99 %9.1f us  cpu %7.1f us/IO\n' "$name" "$s" "${val[$name.$s]}" "$unit" \
          "${lat[$name.$s]}" "${p99[$name.$s]}" "${cpu[$name.$s]}"
        rval[$name.$s]+=" ${val[$name.$s]}"
        rlat[$name.$s]+=" ${lat[$name.$s]}"
        rp99[$name.$s]+=" ${p99[$name.$s]}"
        rcpu[$name.$s]+=" ${cpu[$name.$s]}"
        rcpu1[$name.$s]+=" ${cpu1[$name.$s]}"
        rcpu2[$name.$s]+=" ${cpu2[$name.$s]}"
        rfcpu[$name.$s]+=" ${fcpu[$name.$s]}"
      done
    done
  done
  for j in "${jobs[@]}"; do
    read -r name _ _ _ _ <<<"$j"
    for s in "${servers[@]}"; do
      val[$name.$s]=$(median "${rval[$name.$s]}")
      lat[$name.$s]=$(median "${rlat[$name.$s]}")
      p99[$name.$s]=$(median "${rp99[$name.$s]}")
      cpu[$name.$s]=$(median "${rcpu[$name.$s]}")
      cpu1[$name.$s]=$(median "${rcpu1[$name.$s]}")
      cpu2[$name.$s]=$(median "${rcpu2[$name.$s]}")
      fcpu[$name.$s]=$(median "${rfcpu[$name.$s]}")
    done
  done

  # The tables: values (with the latency of the 4 KiB random reads), then every ratio of one
  # of our set-ups to a baseline, then the servers' CPU time per I/O.
  local where="loopback (127.0.0.1); ours over unix sockets, baselines over unix sockets and TCP"
  [[ $place == netns ]] && where="two hosts: servers in network namespace $ns behind a veth pair at MTU $ns_mtu, RoCE path MTU $pmtu; fio and our initiator in the root namespace"
  local hdr row o b m w pairs=()
  for o in "${ours[@]}"; do for b in "${bases[@]}"; do pairs+=("$o/$b"); done; done
  col() { # WIDTH of a column named $1
    local n=${#1}
    ((n < 10)) && n=10
    echo "$n"
  }
  # Rows: "NAME|KIND|UNIT", KIND value (the job's MiB/s or IOPS), mean or p99 (latency).
  local rows=() r kind
  for j in "${jobs[@]}"; do
    read -r name _ _ _ unit <<<"$j"
    rows+=("$name|value|$unit")
  done
  for qd in $QDS; do
    name=randread-4k-qd$qd
    [[ -v "lat[$name.${servers[0]}]" ]] && rows+=("$name|mean|us mean" "$name|p99|us p99")
  done
  figure() { # KIND KEY
    case $1 in mean) echo "${lat[$2]}" ;; p99) echo "${p99[$2]}" ;; *) echo "${val[$2]}" ;; esac
  }
  echo
  echo "== NBD summary, $where: fio nbd engine, ${RUNTIME}s per job, export $SIZE, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)$([[ $REPEAT -gt 1 ]] && echo ", median of $REPEAT rounds")"
  hdr=$(printf '%-20s %-8s |' job unit)
  for s in "${servers[@]}"; do hdr+=$(printf " %$(col "$s")s" "$s"); done
  echo "$hdr"
  for r in "${rows[@]}"; do
    IFS='|' read -r name kind unit <<<"$r"
    row=$(printf '%-20s %-8s |' "$name" "$unit")
    for s in "${servers[@]}"; do row+=$(printf " %$(col "$s").1f" "$(figure "$kind" "$name.$s")"); done
    echo "$row"
  done
  if ((${#pairs[@]} > 0)); then
    echo
    echo "== ratios, ours/baseline (throughput: higher is better; latency rows: lower is better)"
    hdr=$(printf '%-20s %-8s |' job unit)
    for w in "${pairs[@]}"; do hdr+=$(printf " %$(col "$w")s" "$w"); done
    echo "$hdr"
    for r in "${rows[@]}"; do
      IFS='|' read -r name kind unit <<<"$r"
      row=$(printf '%-20s %-8s |' "$name" "$unit")
      for w in "${pairs[@]}"; do
        o=${w%%/*}
        b=${w#*/}
        row+=$(printf " %$(col "$w").2f" "$(ratio "$(figure "$kind" "$name.$o")" "$(figure "$kind" "$name.$b")")")
      done
      echo "$row"
    done
  fi
  echo
  echo "== CPU time of each server's processes per I/O, us (ours: target + initiator; ramp included)"
  hdr=$(printf '%-20s %-8s |' job unit)
  for s in "${servers[@]}"; do hdr+=$(printf " %$(col "$s")s" "$s"); done
  echo "$hdr"
  for j in "${jobs[@]}"; do
    read -r name _ _ _ _ <<<"$j"
    row=$(printf '%-20s %-8s |' "$name" "us/IO")
    for s in "${servers[@]}"; do row+=$(printf " %$(col "$s").1f" "${cpu[$name.$s]}"); done
    echo "$row"
  done
  # The same by process, with fio's: where a set-up's CPU goes. On a machine whose CPUs the
  # run fills, throughput follows the sum: a split set-up's initiator alone (an NBD server and an
  # SRP initiator) against a TCP server's whole process shows what its target may cost.
  echo
  echo "== CPU time per I/O by process, us: fio (the NBD client) + the server's processes (split set-ups: target + initiator)"
  hdr=$(printf '%-20s |' job)
  for s in "${servers[@]}"; do hdr+=$(printf " %28s" "$s"); done
  echo "$hdr"
  for j in "${jobs[@]}"; do
    read -r name _ _ _ _ <<<"$j"
    row=$(printf '%-20s |' "$name")
    for s in "${servers[@]}"; do
      if [[ " ${splits[*]} " == *" $s "* ]]; then
        row+=$(printf " %7.1f + %6.1f + %6.1f =%5.0f" "${fcpu[$name.$s]}" "${cpu1[$name.$s]}" "${cpu2[$name.$s]}" \
          "$(jq -n "${fcpu[$name.$s]} + ${cpu[$name.$s]}")")
      else
        row+=$(printf " %16.1f + %6.1f =%5.0f" "${fcpu[$name.$s]}" "${cpu[$name.$s]}" "$(jq -n "${fcpu[$name.$s]} + ${cpu[$name.$s]}")")
      fi
    done
    echo "$row"
  done
  local refb=""
  for b in qemu-nbd qemu-nbd-tcp; do [[ " ${bases[*]} " == *" $b "* ]] && { refb=$b; break; }; done
  if [[ " $QDS " == *" 1 "* && ${#splits[@]} -gt 0 && -n $refb && -v "lat[randread-4k-qd1.$refb]" ]]; then
    name=randread-4k-qd1
    echo
    echo "== QD1 4 KiB read latency of the split set-ups against a reference: $refb's latency plus one"
    echo "   UDP round trip between two Go processes ($udp_mean us, measured above), the exchange the split"
    echo "   set-up adds (NBD client -> initiator process -> target process and back). Not a hard floor:"
    echo "   our processes overlap work that the two separate measurements each pay in full."
    for o in "${splits[@]}"; do
      printf '%-16s mean %8.1f us   reference %8.1f us   ours/reference %5.2f   cpu %7.1f us/IO (target + initiator)\n' "$o" \
        "${lat[$name.$o]}" "$(jq -n "${lat[$name.$refb]} + $udp_mean")" \
        "$(ratio "${lat[$name.$o]}" "$(jq -n "${lat[$name.$refb]} + $udp_mean")")" "${cpu[$name.$o]}"
    done
  fi

  ((${#ourpids[@]} == 0)) || { stop "${ourpids[@]}"; forget "${ourpids[@]}"; }
  local rest=("${pids[@]}")
  ((${#rest[@]} == 0)) || { stop "${rest[@]}"; forget "${rest[@]}"; }
  if [[ -n $PROFILE ]]; then
    for o in "${ours[@]}"; do
      for p in target initiator; do
        [[ -s $pdir/$o.$tag.$p.cpu.pprof ]] || continue # a local set-up has one process (initiator)
        echo
        echo "== CPU profile of $o's $p process ($pdir/$o.$tag.$p.cpu.pprof), covering the fill and every job"
        (cd "$root" && go tool pprof -top -nodecount=30 "$pdir/$o.$tag.$p.cpu.pprof" 2>/dev/null | sed -n '1,40p') || true
      done
    done
  fi
}

# ---------------------------------------------------------------------------------------------
# rdma_compare: softroce RDMA WRITE / READ streams and TCP streams of the same bytes between a
# client process (root namespace) and server processes (srv_addr, in the servers' namespace).
rdma_compare() {
  local maxsz=0 maxqd=0 x n label
  for x in ${RDMA_SIZES//,/ }; do
    n=$(numfmt --from=iec "${x^^}")
    ((n > maxsz)) && maxsz=$n
  done
  for x in ${RDMA_QDS//,/ }; do ((x > maxqd)) && maxqd=$x; done
  label="loopback (127.0.0.1), two processes"
  [[ $place == netns ]] && label="two hosts: servers in network namespace $ns, veth MTU $ns_mtu"
  echo
  echo "== transport: softroce RDMA streams and TCP streams between two processes, $label"
  rm -f "$work/rdma-server.ready" "$work/tcp-server.ready"
  "${nsexec[@]}" "$bin" rdma-server -addr "$srv_addr" -mtu "$pmtu" -mem "$((maxsz * maxqd))" \
    -ready "$work/rdma-server.ready" >"$work/rdma-server.log" 2>&1 &
  local rpid=$!
  pids+=("$rpid")
  "${nsexec[@]}" "$bin" tcp-server -addr "$srv_addr" -max-size "$((maxsz * maxqd))" -ready "$work/tcp-server.ready" >"$work/tcp-server.log" 2>&1 &
  local tpid=$!
  pids+=("$tpid")
  wait_file "$work/rdma-server.ready" rdma-server "$rpid"
  wait_file "$work/tcp-server.ready" tcp-server "$tpid"
  local rudp ttcp
  rudp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$work/rdma-server.ready")
  ttcp=$(sed -n 's/.*tcp=\([^ ]*\).*/\1/p' "$work/tcp-server.ready")
  # Bounded: every stream runs RDMA_WARMUP + RDMA_TIME, twice (softroce, TCP), REPEAT times.
  local nstreams limit
  nstreams=$(($(tr ',' '\n' <<<"$RDMA_OPS" | grep -c .) * $(tr ',' '\n' <<<"$RDMA_SIZES" | grep -c .) * $(tr ',' '\n' <<<"$RDMA_QDS" | grep -c .) * 2 * REPEAT))
  limit=$(jq -n "($RDMA_TIME + $RDMA_WARMUP + 5) * $nstreams + 120 | ceil")
  # In the background, waited for: a signal to this script then stops it at once (the EXIT
  # trap), not after the run.
  timeout "$limit" "$bin" rdma -rdma-target "$rudp" -rdma-pid "$rpid" -tcp-target "$ttcp" -tcp-pid "$tpid" \
    -addr "$ini_addr" -mtu "$pmtu" -ops "$RDMA_OPS" -sizes "$RDMA_SIZES" -qds "$RDMA_QDS" \
    -time "${RDMA_TIME}s" -warmup "${RDMA_WARMUP}s" -repeat "$REPEAT" -label "$label, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)" \
    2>"$work/rdma-client.log" &
  local cpid=$! crc=0
  pids+=("$cpid")
  wait "$cpid" || crc=$?
  forget "$cpid"
  if ((crc != 0)); then
    echo "bench.sh: srpbench rdma failed; its log, then the servers':" >&2
    cat "$work/rdma-client.log" "$work/rdma-server.log" "$work/tcp-server.log" >&2 || true
    exit 1
  fi
  stop "$rpid" "$tpid"
  forget "$rpid" "$tpid"
}

# ---------------------------------------------------------------------------------------------
# The "two hosts" set-up: a network namespace and a veth pair, names unique to this run (the
# script's PID), a private /30 that no address or route of the root namespace touches. Every ip
# command is bounded; cleanup (EXIT trap) removes them.

# skip_netns REASON: say loudly that the section does not run, on stdout and stderr.
skip_netns() {
  local msg="SKIPPED: bench.sh section netns (two hosts: network namespace + veth pair): $1"
  echo
  echo "################################################################################"
  echo "$msg"
  echo "################################################################################"
  echo "$msg" >&2
}

# netns_pick_addrs: ini_addr and srv_addr, the two hosts of a /30 in 10.213.0.0/16, starting
# from one derived from the PID and skipping any /30 with an address or route in the root
# namespace (parallel runs, or a network of the host).
netns_pick_addrs() {
  local i idx x y net
  for i in $(seq 0 255); do
    idx=$((($$ + i) % 16384))
    x=$((idx / 64))
    y=$((idx % 64 * 4))
    net=10.213.$x.$y/30
    [[ -z $(timeout 10 ip -4 -o addr show to "$net") ]] || continue
    [[ -z $(timeout 10 ip -4 route show root "$net") ]] || continue
    timeout 10 ip -4 route show match "$net" | grep -qv '^default' && continue
    ini_addr=10.213.$x.$((y + 1))
    srv_addr=10.213.$x.$((y + 2))
    return 0
  done
  return 1
}

# netns_create: the namespace srpb$$ with veth end srpb$$n (srv_addr) and, in the root
# namespace, srpb$$r (ini_addr). Returns 1 (after undoing what it did) if the kernel refuses.
netns_create() {
  local veth_n=srpb$$n
  netns_pick_addrs || { echo "no free /30 in 10.213.0.0/16" >&2; return 1; }
  timeout 10 ip netns add "srpb$$" || return 1
  ns=srpb$$
  veth_r=srpb$$r
  if ! { timeout 10 ip link add "$veth_r" type veth peer name "$veth_n" netns "$ns" &&
    timeout 10 ip addr add "$ini_addr/30" dev "$veth_r" &&
    timeout 10 ip link set "$veth_r" up &&
    timeout 10 ip -n "$ns" addr add "$srv_addr/30" dev "$veth_n" &&
    timeout 10 ip -n "$ns" link set "$veth_n" up &&
    timeout 10 ip -n "$ns" link set lo up; }; then
    netns_delete
    return 1
  fi
  nsexec=(ip netns exec "$ns")
}

# netns_mtu MTU: both ends of the veth pair at MTU; waits (bounded) until the link is up.
netns_mtu() {
  local n
  timeout 10 ip link set dev "$veth_r" mtu "$1"
  timeout 10 ip -n "$ns" link set dev "srpb$$n" mtu "$1"
  ns_mtu=$1
  for n in $(seq 100); do
    timeout 10 ip -o link show dev "$veth_r" | grep -q LOWER_UP && return 0
    sleep 0.1
  done
  echo "bench.sh: veth $veth_r is not up after 10 s" >&2
  return 1
}

netns_section() {
  if [[ $EUID -ne 0 ]]; then
    skip_netns "needs root to create a network namespace and a veth pair (running as uid $EUID)"
    return 0
  fi
  if ! netns_create 2>"$work/netns.err"; then
    skip_netns "cannot create the namespace or the veth pair: $(tr '\n' ' ' <"$work/netns.err")"
    return 0
  fi
  echo
  echo "== two hosts: namespace $ns ($srv_addr, veth srpb$$n) <-> root namespace ($ini_addr, veth $veth_r)"
  local m
  for m in $NETNS_MTUS; do
    netns_mtu "$m" || exit 1
    # The RoCE path MTU rxe derives from the interface MTU (iboe_get_mtu: the MTU less 96 bytes
    # of headers, rounded down to an IB MTU), which softroce's dialler also applies.
    pmtu=$(awk -v m="$m" 'BEGIN { p = 0; for (v = 256; v <= 4096; v *= 2) if (m - 96 >= v) p = v; print p }')
    ((pmtu > 0)) || { echo "bench.sh: NETNS_MTUS: $m is too small for RoCE" >&2; exit 2; }
    echo
    echo "== two hosts at veth MTU $m (RoCE path MTU $pmtu)"
    place=netns
    netns_wants nbd && nbd_compare
    netns_wants rdma && rdma_compare
  done
  place=loopback
  nsexec=()
  srv_addr=127.0.0.1
  ini_addr=127.0.0.1
  pmtu=0
  netns_delete
}

# ---------------------------------------------------------------------------------------------
mem_section() {
  local n lines=()
  echo
  echo "== target memory: sessions of $CHANNELS channels at queue depth $MEM_QD, RAM LUN $MEM_LUN, N = $MEM_IOS I/Os ($MEM_SIZES)"
  for n in $MEM_SESSIONS; do
    start_target "mem$n" -lun-size "$MEM_LUN" -qd "$MEM_QD" -stats-socket "$work/mem$n.stats"
    local out
    if ! out=$(timeout 1200 "$bin" mem -target "$tudp" -pid "$tpid" -stats-socket "$work/mem$n.stats" \
      -sessions "$n" -channels "$CHANNELS" -qd "$MEM_QD" -ios "$MEM_IOS" -sizes "$MEM_SIZES" \
      -workers "$MEM_WORKERS" -label "mem$n" 2>"$work/mem$n.driver.log"); then
      echo "bench.sh: srpbench mem with $n sessions failed:" >&2
      cat "$work/mem$n.driver.log" >&2
      exit 1
    fi
    echo "$out"
    lines+=("$out")
    stop "$tpid"
    forget "$tpid"
  done
  echo
  echo "== target memory summary (KiB; registered = the target's channel memory, the bound of what request slots can touch)"
  printf '%-8s %-8s | %12s %12s %12s %12s %12s %12s | %12s %12s\n' sessions channels before-login after-login \
    after-warmup after-N after-10N VmHWM registered registered/ch
  local o
  for o in "${lines[@]}"; do
    get() { grep " phase=$1 " <<<"$o" | sed -n "s/.* $2=\([0-9]*\).*/\1/p"; }
    printf '%-8s %-8s | %12s %12s %12s %12s %12s %12s | %12s %12s\n' \
      "$(get after-10N sessions)" "$(get after-10N channels)" "$(get before-login vmrss_kib)" \
      "$(get after-login+fill vmrss_kib)" "$(get after-warmup vmrss_kib)" "$(get after-N vmrss_kib)" \
      "$(get after-10N vmrss_kib)" "$(get after-10N vmhwm_kib)" "$(get after-10N registered_kib)" \
      "$(get after-10N registered_per_channel_kib)"
  done
}

want nbd && nbd_compare
want rdma && rdma_compare
want netns && netns_section
want mem && mem_section
exit 0
