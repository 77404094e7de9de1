#!/usr/bin/env bash
# make bench: srpd's NBD export of a remote LUN against qemu-nbd and nbdkit, and the target's
# memory with 1 and 64 sessions.
#
# Section "nbd": three NBD servers of the same size, each on its own unix socket in a private
# directory on tmpfs, filled with the same random data:
#   ours      bench/cmd/srpbench nbd -local: one process, as srpd runs its loopback demo
#             (configs/demo-loopback.yaml): an SRP target (RAM LUN) and an SRP initiator that
#             logs in to it over softroce (RDMA CM, 2 channels) on one softroce device, serving
#             LUN 0 with package initiator/nbd. Their packets take softroce's loopback path, as
#             between two QPs of one kernel rxe device (rxe_loopback), not the UDP socket;
#   ours-2proc  the same as two processes (srpbench target, srpbench nbd) on two softroce
#             devices: RoCEv2 over the kernel's UDP loopback;
#   qemu-nbd  a raw file on /dev/shm (--cache=none --aio=threads);
#   nbdkit    the memory plugin.
# The same fio jobs (nbd engine) run against each in turn: 128 KiB sequential read and write
# and 4 KiB random read, at queue depth 32 and 1. The table gives MiB/s or IOPS, the mean and
# p99 completion latency of 4 KiB random reads at QD 1, and the ratios ours/qemu-nbd and
# ours/nbdkit (for latency: ours/other, lower is better).
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
#   bench/bench.sh                # both sections (make bench)
#   bench/bench.sh nbd            # make bench-nbd
#   bench/bench.sh mem            # make bench-mem
#   RUNTIME=5 SIZE=256m bench/bench.sh nbd
#   REPEAT=3 bench/bench.sh nbd   # three interleaved rounds, medians in the summary
#   PROFILE=1 bench/bench.sh nbd  # CPU profiles of our processes, top functions printed
#
# Environment: RUNTIME (s per fio job, 10), REPEAT (rounds of all jobs, interleaved; the summary
# gives medians; 1), RAMP (s, 1), SIZE (export size, 1g), QDS ("32 1"), JOBS (words; only the
# jobs whose name contains one of them, e.g. "randread 128k-qd1"; default all),
# CHANNELS (2), INI_QD (initiator queue depth per channel, 64), OURS (our set-ups, each run in
# the same run as its own processes: MODE[:GOMAXPROCS], MODE local (column ours), localcopy
# (column ours-copy: local with the NBD buffers on the Go heap, copied through the initiator's
# slot buffers, as before direct Buffers) or split (column ours-2proc), GOMAXPROCS N adds -gmpN to the column (default: Go's, the number of CPUs); default
# "local split"; MODE[:GOMAXPROCS]+FLAG[+FLAG] passes FLAGs to the NBD process, column -xN),
# PROFILE, PROFILE_DIR
# (where to keep the profiles; default: the work directory, removed at exit), MEM_SESSIONS ("1 64"),
# MEM_QD (128), MEM_IOS (N, 20000), MEM_LUN (64m), MEM_SIZES ("4k,4k,16k,64k"), MEM_WORKERS
# (I/O goroutines per session, 0: channels × qd / 2), MEM_GOMAXPROCS (of the target; default Go's).
# Needs: go, fio, qemu-nbd (qemu-utils), nbdkit, nbdcopy and nbdinfo (libnbd-bin), jq, openssl.
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
PROFILE=${PROFILE:-}
MEM_SESSIONS=${MEM_SESSIONS:-"1 64"}
MEM_QD=${MEM_QD:-128}
MEM_IOS=${MEM_IOS:-20000}
MEM_LUN=${MEM_LUN:-64m}
MEM_SIZES=${MEM_SIZES:-4k,4k,16k,64k}
MEM_WORKERS=${MEM_WORKERS:-0}
MEM_GOMAXPROCS=${MEM_GOMAXPROCS:-}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
sections=("$@")
[[ ${#sections[@]} -gt 0 ]] || sections=(nbd mem)
for s in "${sections[@]}"; do
  [[ $s == nbd || $s == mem ]] || { echo "bench.sh: unknown section $s (nbd, mem)" >&2; exit 2; }
done
want() { local s; for s in "${sections[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }

tools=(go jq)
want nbd && tools+=(fio qemu-nbd nbdkit nbdcopy nbdinfo openssl)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "bench.sh: $tool not found" >&2; exit 1; }
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
cleanup() {
  [[ ${#pids[@]} -gt 0 ]] && stop "${pids[@]}"
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
pdir=${PROFILE_DIR:-$work}

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
nbd_section() {
  local bytes name rw bs qd dir s out j g
  bytes=$(numfmt --from=iec "${SIZE^^}")
  echo "== image: $SIZE of random data in $work (tmpfs)"
  openssl rand -out "$work/img.raw" "$bytes"

  # Ours, once per entry of OURS (MODE[:GOMAXPROCS]): "local" is one process with the SRP target
  # and the SRP initiator + NBD export on one softroce device, as srpd runs its loopback demo
  # (packets between them take softroce's loopback path, as between two QPs of one kernel rxe
  # device); "split" is a target process and an initiator + NBD process on two softroce devices,
  # whose packets cross the kernel's UDP loopback.
  declare -A uri cpupids
  local servers=() ourpids=() splits=()
  local spec mode
  for spec in $OURS; do
    # MODE[:GOMAXPROCS][+FLAG...]: FLAGs (e.g. +-read-spin=-1ns) go to the NBD process and,
    # numbered, into the column's name.
    local xflags=()
    if [[ $spec == *+* ]]; then
      IFS=+ read -r -a xflags <<<"${spec#*+}"
      spec=${spec%%+*}
    fi
    mode=${spec%%:*}
    g=default
    [[ $spec == *:* ]] && g=${spec#*:}
    case $mode in
      local) s=ours ;;
      localcopy) s=ours-copy ;;
      split) s=ours-2proc ;;
      *) echo "bench.sh: OURS entry $spec: mode must be local, localcopy or split" >&2; exit 2 ;;
    esac
    local bufflag=()
    [[ $mode == localcopy ]] && bufflag=(-heap-buffers)
    [[ $g == default ]] || s+=-gmp$g
    if ((${#xflags[@]} > 0)); then
      nx=$((${nx:-0} + 1))
      s+=-x$nx
      echo "== $s: NBD process flags ${xflags[*]}"
    fi
    local genv=()
    [[ $g == default ]] || genv=(GOMAXPROCS=$g)
    local tprof=() iprof=()
    if [[ -n $PROFILE ]]; then
      mkdir -p "$pdir"
      tprof=(-cpuprofile "$pdir/$s.target.cpu.pprof")
      iprof=(-cpuprofile "$pdir/$s.initiator.cpu.pprof")
    fi
    local npid
    if [[ $mode == local* ]]; then
      echo "== starting $s: one process, SRP target + SRP initiator + NBD on one softroce device ($CHANNELS channels, QD $INI_QD, GOMAXPROCS $g)"
      env "${genv[@]}" "$bin" nbd -local -lun-size "$SIZE" -target-qd 128 -socket "$work/$s.sock" -ready "$work/$s.nbd.ready" \
        -channels "$CHANNELS" -qd "$INI_QD" "${bufflag[@]}" "${xflags[@]}" "${iprof[@]}" >"$work/$s.nbd.log" 2>&1 &
      npid=$!
      pids+=("$npid")
      wait_file "$work/$s.nbd.ready" "$s.nbd" "$npid"
      cpupids[$s]="$npid"
      ourpids+=("$npid")
    else
      echo "== starting $s: SRP target process, SRP initiator + NBD process ($CHANNELS channels, QD $INI_QD, GOMAXPROCS $g)"
      rm -f "$work/$s.target.ready"
      env "${genv[@]}" "$bin" target -ready "$work/$s.target.ready" -lun-size "$SIZE" -qd 128 "${tprof[@]}" >"$work/$s.target.log" 2>&1 &
      tpid=$!
      pids+=("$tpid")
      wait_file "$work/$s.target.ready" "$s.target" "$tpid"
      tudp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$work/$s.target.ready")
      env "${genv[@]}" "$bin" nbd -target "$tudp" -socket "$work/$s.sock" -ready "$work/$s.nbd.ready" \
        -channels "$CHANNELS" -qd "$INI_QD" "${xflags[@]}" "${iprof[@]}" >"$work/$s.nbd.log" 2>&1 &
      npid=$!
      pids+=("$npid")
      wait_file "$work/$s.nbd.ready" "$s.nbd" "$npid"
      cpupids[$s]="$tpid $npid"
      ourpids+=("$tpid" "$npid")
      splits+=("$s")
    fi
    uri[$s]="nbd+unix:///disk?socket=$work/$s.sock"
    servers+=("$s")
  done
  qemu-nbd -k "$work/qemu.sock" -x disk -f raw -t --cache=none --aio=threads "$work/img.raw" >"$work/qemu.log" 2>&1 &
  pids+=($!)
  nbdkit -f -U "$work/nbdkit.sock" -e disk -t 4 memory "$bytes" >"$work/nbdkit.log" 2>&1 &
  pids+=($!)
  uri[qemu-nbd]="nbd+unix:///disk?socket=$work/qemu.sock"
  uri[nbdkit]="nbd+unix:///disk?socket=$work/nbdkit.sock"
  local ours=("${servers[@]}")
  servers+=(qemu-nbd nbdkit)
  for s in "${servers[@]}"; do wait_nbd "${uri[$s]}"; done
  echo "== filling ${ours[*]} and nbdkit from the image (nbdcopy)"
  for s in "${ours[@]}" nbdkit; do timeout 600 nbdcopy --flush "$work/img.raw" "${uri[$s]}"; done

  # The transport floor, in the same run: a 64-byte UDP request answered with 4 KiB + 64 bytes
  # between two Go processes (what an SRP read's SEND and RDMA WRITE + SEND cost at least).
  rm -f "$work/udp.ready"
  "$bin" udp-echo -ready "$work/udp.ready" -reply 4160 >"$work/udp.log" 2>&1 &
  local upid=$!
  pids+=("$upid")
  wait_file "$work/udp.ready" udp "$upid"
  local udpline udp_mean
  udpline=$("$bin" udp-ping -target "$(sed -n 's/udp=\([^ ]*\).*/\1/p' "$work/udp.ready")" -time "${RUNTIME}s")
  udp_mean=$(sed -n 's/.*mean_us=\([0-9.]*\).*/\1/p' <<<"$udpline")
  stop "$upid"
  forget "$upid"
  echo "udp round trip (2 Go processes, 64 B / 4160 B): $udpline"

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
  declare -A val lat p99 cpu rval rlat rp99 rcpu
  local unit rep
  ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
  # The median of a space-separated list of numbers.
  median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
  # REPEAT rounds of every job against every server, interleaved (the machine's load drifts
  # over minutes); the summary takes each figure's median over the rounds.
  for rep in $(seq 1 "$REPEAT"); do
  [[ $REPEAT -gt 1 ]] && echo "== round $rep of $REPEAT"
  for j in "${jobs[@]}"; do
    read -r name rw bs qd unit <<<"$j"
    dir=read; [[ $rw == *write* ]] && dir=write
    for s in "${servers[@]}"; do
      out="$work/$name.$s.json"
      local c0="" t0 t1 ios
      [[ -n ${cpupids[$s]:-} ]] && c0=$(ticks ${cpupids[$s]})
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
      local extra=""
      if [[ -n $c0 ]]; then
        # CPU time of our processes per I/O (ramp included: I/Os estimated from the IOPS
        # over the whole job's wall time).
        ios=$(jq -r ".jobs[0].$dir.iops" "$out")
        cpu[$name.$s]=$(jq -n "($(ticks ${cpupids[$s]}) - $c0) / $(getconf CLK_TCK) * 1e6 / ($ios * ($t1 - $t0) / 1e9)")
        extra=$(printf '  cpu %7.1f us/IO' "${cpu[$name.$s]}")
      fi
      printf '%-20s %-10s %10.1f %-5s  mean %9.1f us  p99 %9.1f us%s\n' "$name" "$s" "${val[$name.$s]}" "$unit" \
        "${lat[$name.$s]}" "${p99[$name.$s]}" "$extra"
      rval[$name.$s]+=" ${val[$name.$s]}"
      rlat[$name.$s]+=" ${lat[$name.$s]}"
      rp99[$name.$s]+=" ${p99[$name.$s]}"
      [[ -n $c0 ]] && rcpu[$name.$s]+=" ${cpu[$name.$s]}"
    done
  done
  done
  for j in "${jobs[@]}"; do
    read -r name _ _ _ _ <<<"$j"
    for s in "${servers[@]}"; do
      val[$name.$s]=$(median "${rval[$name.$s]}")
      lat[$name.$s]=$(median "${rlat[$name.$s]}")
      p99[$name.$s]=$(median "${rp99[$name.$s]}")
      [[ -n ${rcpu[$name.$s]:-} ]] && cpu[$name.$s]=$(median "${rcpu[$name.$s]}")
    done
  done

  ratio() { jq -n "if $2 == 0 then 0 else $1 / $2 end"; }
  echo
  echo "== NBD summary: fio nbd engine, unix sockets, ${RUNTIME}s per job, export $SIZE, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)$([[ $REPEAT -gt 1 ]] && echo ", median of $REPEAT rounds")"
  local hdr row o
  hdr=$(printf '%-20s %-6s |' job unit)
  for s in "${servers[@]}"; do hdr+=$(printf ' %10s' "$s"); done
  hdr+=" |"
  for o in "${ours[@]}"; do hdr+=$(printf ' %15s %15s' "$o/qemu" "$o/nbdkit"); done
  echo "$hdr"
  for j in "${jobs[@]}"; do
    read -r name _ _ _ unit <<<"$j"
    row=$(printf '%-20s %-6s |' "$name" "$unit")
    for s in "${servers[@]}"; do row+=$(printf ' %10.1f' "${val[$name.$s]}"); done
    row+=" |"
    for o in "${ours[@]}"; do
      row+=$(printf ' %15.2f %15.2f' "$(ratio "${val[$name.$o]}" "${val[$name.qemu-nbd]}")" "$(ratio "${val[$name.$o]}" "${val[$name.nbdkit]}")")
    done
    echo "$row"
  done
  for qd in $QDS; do
    name=randread-4k-qd$qd
    [[ -v "lat[$name.qemu-nbd]" ]] || continue # not among JOBS
    for m in mean p99; do
      row=$(printf '%-20s %-6s |' "$name" "us $m")
      for s in "${servers[@]}"; do
        if [[ $m == mean ]]; then row+=$(printf ' %10.1f' "${lat[$name.$s]}"); else row+=$(printf ' %10.1f' "${p99[$name.$s]}"); fi
      done
      row+=" |"
      for o in "${ours[@]}"; do
        if [[ $m == mean ]]; then
          row+=$(printf ' %15.2f %15.2f' "$(ratio "${lat[$name.$o]}" "${lat[$name.qemu-nbd]}")" "$(ratio "${lat[$name.$o]}" "${lat[$name.nbdkit]}")")
        else
          row+=$(printf ' %15.2f %15.2f' "$(ratio "${p99[$name.$o]}" "${p99[$name.qemu-nbd]}")" "$(ratio "${p99[$name.$o]}" "${p99[$name.nbdkit]}")")
        fi
      done
      echo "$row   (lower is better)"
    done
  done
  if [[ " $QDS " == *" 1 "* && ${#splits[@]} -gt 0 && -v "lat[randread-4k-qd1.qemu-nbd]" ]]; then
    name=randread-4k-qd1
    echo
    echo "== QD1 4 KiB read latency of the split set-ups against a reference: qemu-nbd's latency plus one"
    echo "   UDP round trip between two Go processes ($udp_mean us, measured above), the exchange the split"
    echo "   set-up adds (NBD client -> initiator process -> target process and back). Not a hard floor:"
    echo "   our processes overlap work that the two separate measurements each pay in full."
    for o in "${splits[@]}"; do
      printf '%-16s mean %8.1f us   reference %8.1f us   ours/reference %5.2f   cpu %7.1f us/IO (target + initiator)\n' "$o" \
        "${lat[$name.$o]}" "$(jq -n "${lat[$name.qemu-nbd]} + $udp_mean")" \
        "$(ratio "${lat[$name.$o]}" "$(jq -n "${lat[$name.qemu-nbd]} + $udp_mean")")" "${cpu[$name.$o]}"
    done
  fi

  stop "${ourpids[@]}"
  forget "${ourpids[@]}"
  local rest=("${pids[@]}")
  stop "${rest[@]}"
  forget "${rest[@]}"
  if [[ -n $PROFILE ]]; then
    for o in "${ours[@]}"; do
      for p in target initiator; do
        [[ -s $pdir/$o.$p.cpu.pprof ]] || continue # a local set-up has one process (initiator)
        echo
        echo "== CPU profile of $o's $p process ($pdir/$o.$p.cpu.pprof), covering the fill and every job"
        (cd "$root" && go tool pprof -top -nodecount=30 "$pdir/$o.$p.cpu.pprof" 2>/dev/null | sed -n '1,40p') || true
      done
    done
  fi
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

want nbd && nbd_section
want mem && mem_section
exit 0
