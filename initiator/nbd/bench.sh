#!/usr/bin/env bash
# Side-by-side NBD server benchmark: our server (package nbd, RAM device, served by
# internal/nbdserve), qemu-nbd (raw file on /dev/shm) and `nbdkit memory`, each with a 1 GiB
# export filled with the same random data, each on its own unix socket in a private directory.
# The same fio nbd-engine jobs run against each, then a whole-export sequential read with
# `nbdcopy URI null:` (the recipe of shared/reference/tools-and-anchors.md A.3); the script
# prints IOPS, bandwidth and latency, and the ratios ours/qemu-nbd and ours/nbdkit.
#
# Note: qemu-nbd 7.2 answers fio's 128 KiB requests very slowly (about 25 ms each, on unix
# sockets and TCP alike; 64 KiB requests are fine), so the 128 KiB ratios against qemu-nbd say
# more about that than about us; the nbdcopy line is the fair sequential comparison.
#
#   initiator/nbd/bench.sh                 # from the repository root or anywhere
#   RUNTIME=20 SIZE=1g initiator/nbd/bench.sh
#
# Needs: go, fio, qemu-utils (qemu-nbd), nbdkit, libnbd-bin (nbdcopy, nbdinfo), jq.
# Only the processes this script starts are stopped (by PID).
set -euo pipefail

RUNTIME=${RUNTIME:-10}          # seconds per fio job
SIZE=${SIZE:-1g}                # export size (fio --size and image size)
SEQ_QD=${SEQ_QD:-8}             # queue depth of the 128 KiB sequential jobs
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

for tool in go fio qemu-nbd nbdkit nbdcopy nbdinfo jq openssl; do
  command -v "$tool" >/dev/null || { echo "bench.sh: $tool not found" >&2; exit 1; }
done

work=$(mktemp -d /dev/shm/nbdbench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

bytes=$(numfmt --from=iec "${SIZE^^}")
echo "== image: $SIZE of random data in $work (tmpfs)"
openssl rand -out "$work/img.raw" "$bytes"

echo "== building nbdserve"
(cd "$root" && go build -o "$work/nbdserve" ./initiator/nbd/internal/nbdserve)

wait_sock() { # uri
  for _ in $(seq 100); do
    nbdinfo --can connect "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bench.sh: server at $1 did not come up" >&2
  exit 1
}

"$work/nbdserve" -socket "$work/ours.sock" -size "$bytes" -export disk &
pids+=($!)
qemu-nbd -k "$work/qemu.sock" -x disk -f raw -t --cache=none --aio=threads "$work/img.raw" &
pids+=($!)
nbdkit -f -U "$work/nbdkit.sock" -e disk -t 4 memory "$bytes" &
pids+=($!)

declare -A uri=(
  [ours]="nbd+unix:///disk?socket=$work/ours.sock"
  [qemu-nbd]="nbd+unix:///disk?socket=$work/qemu.sock"
  [nbdkit]="nbd+unix:///disk?socket=$work/nbdkit.sock"
)
servers=(ours qemu-nbd nbdkit)
for s in "${servers[@]}"; do wait_sock "${uri[$s]}"; done

echo "== filling ours and nbdkit from the image (nbdcopy)"
for s in ours nbdkit; do nbdcopy --flush "$work/img.raw" "${uri[$s]}"; done

# name rw bs iodepth
jobs=(
  "randread-4k-qd32 randread 4k 32"
  "randread-4k-qd1 randread 4k 1"
  "seqread-128k-qd$SEQ_QD read 128k $SEQ_QD"
  "seqwrite-128k-qd$SEQ_QD write 128k $SEQ_QD"
)

declare -A iops bw lat p99
for j in "${jobs[@]}"; do
  read -r name rw bs qd <<<"$j"
  dir=read; [[ $rw == *write* ]] && dir=write
  for s in "${servers[@]}"; do
    out="$work/$name.$s.json"
    fio --name="$name" --ioengine=nbd --uri="${uri[$s]}" --rw="$rw" --bs="$bs" --iodepth="$qd" \
        --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$out" >/dev/null
    iops[$name.$s]=$(jq -r ".jobs[0].$dir.iops" "$out")
    bw[$name.$s]=$(jq -r ".jobs[0].$dir.bw_bytes / 1048576" "$out")
    lat[$name.$s]=$(jq -r ".jobs[0].$dir.lat_ns.mean / 1000" "$out")
    p99[$name.$s]=$(jq -r ".jobs[0].$dir.clat_ns.percentile[\"99.000000\"] / 1000" "$out")
    printf '%-20s %-9s %10.0f IOPS %9.1f MiB/s  mean %8.1f us  p99 %8.1f us\n' "$name" "$s" \
      "${iops[$name.$s]}" "${bw[$name.$s]}" "${lat[$name.$s]}" "${p99[$name.$s]}"
  done
done

declare -A copyt
for s in "${servers[@]}"; do
  t0=$(date +%s.%N)
  nbdcopy "${uri[$s]}" null:
  t1=$(date +%s.%N)
  copyt[$s]=$(jq -n "$t1 - $t0")
  printf '%-20s %-9s %8.3f s  %8.2f GB/s\n' "nbdcopy-to-null" "$s" "${copyt[$s]}" "$(jq -n "$bytes / ${copyt[$s]} / 1e9")"
done

echo
echo "== summary (fio nbd engine, unix sockets, ${RUNTIME}s per job, $(nproc) CPUs)"
printf '%-20s | %10s %10s %10s | %12s %12s\n' job ours qemu-nbd nbdkit ours/qemu ours/nbdkit
for j in "${jobs[@]}"; do
  read -r name _ <<<"$j"
  printf '%-20s | %10.0f %10.0f %10.0f | %12.2f %12.2f   (IOPS)\n' "$name" \
    "${iops[$name.ours]}" "${iops[$name.qemu-nbd]}" "${iops[$name.nbdkit]}" \
    "$(jq -n "${iops[$name.ours]} / ${iops[$name.qemu-nbd]}")" \
    "$(jq -n "${iops[$name.ours]} / ${iops[$name.nbdkit]}")"
done
printf '%-20s | %10.2f %10.2f %10.2f | %12.2f %12.2f   (GB/s)\n' "nbdcopy-to-null" \
  "$(jq -n "$bytes / ${copyt[ours]} / 1e9")" "$(jq -n "$bytes / ${copyt[qemu-nbd]} / 1e9")" "$(jq -n "$bytes / ${copyt[nbdkit]} / 1e9")" \
  "$(jq -n "${copyt[qemu-nbd]} / ${copyt[ours]}")" "$(jq -n "${copyt[nbdkit]} / ${copyt[ours]}")"
printf '%-20s | %10s %10s %10s |\n' "mean latency (us)" ours qemu-nbd nbdkit
for j in "${jobs[@]}"; do
  read -r name _ <<<"$j"
  printf '%-20s | %10.1f %10.1f %10.1f |\n' "$name" "${lat[$name.ours]}" "${lat[$name.qemu-nbd]}" "${lat[$name.nbdkit]}"
done
