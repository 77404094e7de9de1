# shellcheck shell=bash
# Run-time helpers (adapted from ../shared/interop/lib/run.sh): namespace, QEMU guests, capture.
# Every process started here is recorded in PIDS and stopped by PID in cleanup(); the namespace
# is always deleted.

PIDS=()
CMD_PID=""      # a host process of ours in the namespace (its own process group)
RUN=""          # $OUT/<mode>
SCRATCH=""      # $CACHE/run: per-run initrds
SUMMARY=/dev/null
TCPDUMP_PID=""

note() { echo "[srp-verbs $(date +%T)] $*" | tee -a "$SUMMARY"; }
nsx() { ip netns exec "$NETNS" "$@"; }

stop_pid() {    # stop_pid PID: SIGTERM, up to 10 s, then SIGKILL
    local p=$1 i
    kill -0 "$p" 2>/dev/null || return 0
    kill -TERM "$p" 2>/dev/null || true
    for i in $(seq 1 20); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL "$p" 2>/dev/null || true
}

stop_cmd() {    # the host process runs as its own process group (setsid)
    [ -n "$CMD_PID" ] || return 0
    local i
    if kill -0 -- "-$CMD_PID" 2>/dev/null; then
        note "stopping CMD (process group $CMD_PID)"
        kill -TERM -- "-$CMD_PID" 2>/dev/null || true
        for i in $(seq 1 10); do kill -0 -- "-$CMD_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$CMD_PID" 2>/dev/null || true
    fi
    wait "$CMD_PID" 2>/dev/null || true
    CMD_PID=""
}

# start_cmd ENV_ASSIGNMENTS... -- CMD...: CMD inside the netns, its own process group.
start_cmd() {
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    setsid ip netns exec "$NETNS" env "${envs[@]}" "$@" > "$RUN/cmd.stdout" 2> "$RUN/cmd.stderr" < /dev/null {LOCK_FD}>&- &
    CMD_PID=$!
    note "CMD started (pid $CMD_PID): $*"
}

cleanup() {
    local p
    stop_cmd
    for p in "${PIDS[@]}"; do stop_pid "$p"; done
    netns_down
    if [ -n "$SCRATCH" ]; then rm -rf "$SCRATCH"; fi
}

start_run() {   # start_run MODE
    need_root
    take_lock
    do_setup || die "setup failed"
    RUN="$OUT/$1"
    SCRATCH="$CACHE/run"
    rm -rf "$RUN" "$SCRATCH"
    mkdir -p "$RUN" "$SCRATCH"
    SUMMARY="$RUN/summary.txt"
    : > "$SUMMARY"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    KVER=$(kver)
    KERNEL="$KROOT/boot/vmlinuz-$KVER"
    note "mode $1, kernel $KVER, output in $RUN"
}

netns_up() {    # netns_up [HOST_ADDR]
    if ip netns list | grep -qw "$NETNS"; then ip netns del "$NETNS"; fi
    ip netns add "$NETNS"
    nsx ip link set lo up
    nsx ip link add "$BRIDGE" type bridge
    nsx ip link set "$BRIDGE" type bridge stp_state 0 forward_delay 0
    local t
    for t in "$TAP_TGT" "$TAP_INI"; do
        nsx ip tuntap add dev "$t" mode tap
        nsx ip link set "$t" master "$BRIDGE"
        nsx ip link set "$t" up
    done
    [ -n "${1:-}" ] && nsx ip addr add "$1/$PREFIX" dev "$BRIDGE"
    nsx ip link set "$BRIDGE" up
    if nsx ip route show | grep -q default; then die "unexpected default route in $NETNS"; fi
    note "netns $NETNS: bridge $BRIDGE${1:+ with $1/$PREFIX}, routes: $(nsx ip route show | tr '\n' ';')"
}

netns_down() {
    if ip netns list 2>/dev/null | grep -qw "$NETNS"; then ip netns del "$NETNS" || true; fi
}

# make_initrd ROLE CONF_TEXT [BINARY...] -> base + rdma-core overlay + the binaries (in
# /opt/srpd, with their libraries) + /etc/run.conf
make_initrd() {
    local role=$1 conf=$2; shift 2
    local st="$SCRATCH/conf-$role" b
    rm -rf "$st"; mkdir -p "$st/etc" "$st/opt/srpd"
    printf '%s\n' "$conf" > "$st/etc/run.conf"
    for b in "$@"; do copy_with_libs "$b" "$st" "/opt/srpd/$(basename "$b")"; done
    pack_cpio "$st" "$SCRATCH/conf-$role.cpio.gz"
    rm -rf "$st"
    cat "$IMGDIR/base.cpio.gz" "$IMGDIR/verbs.cpio.gz" "$SCRATCH/conf-$role.cpio.gz" > "$SCRATCH/initrd-$role.cpio.gz"
    echo "$SCRATCH/initrd-$role.cpio.gz"
}

# start_guest ROLE INITRD ACCEL [qemu args...]; sets GUEST_PID (QEMU itself: ip netns exec execs)
start_guest() {
    local role=$1 initrd=$2 accel=$3; shift 3
    local cpu=max; [ "$accel" = kvm ] && cpu=host
    ip netns exec "$NETNS" qemu-system-x86_64 -name "srpv-$role" -machine q35 -accel "$accel" -cpu "$cpu" \
        -smp "$GUEST_CPUS" -m "$GUEST_MEM_MB" -nodefaults -display none -no-reboot \
        -serial "file:$RUN/$role.console.log" -kernel "$KERNEL" -initrd "$initrd" \
        -append "console=ttyS0 panic=-1 quiet loglevel=4" "$@" > "$RUN/$role.qemu.log" 2>&1 {LOCK_FD}>&- &
    GUEST_PID=$!
    PIDS+=("$GUEST_PID")
}

wait_log() {    # wait_log FILE PATTERN SECONDS PID: 0 when PATTERN appears; 1 on timeout or PID exit
    local f=$1 pat=$2 secs=$3 pid=$4 i=0
    while [ "$i" -lt $((secs * 5)) ]; do
        grep -q -- "$pat" "$f" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { grep -q -- "$pat" "$f" 2>/dev/null; return; }
        sleep 0.2; i=$((i + 1))
    done
    return 1
}

wait_exit() {   # wait_exit PID SECONDS: 0 if PID exited in time
    local pid=$1 secs=$2 i=0
    while [ "$i" -lt $((secs * 5)) ]; do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2; i=$((i + 1))
    done
    return 1
}

guest_done() {  # guest_done ROLE PID SECONDS: wait for power-off, else stop it
    local role=$1 pid=$2 secs=$3
    if ! wait_exit "$pid" "$secs"; then
        note "$role guest still running after ${secs}s; stopping pid $pid"
        stop_pid "$pid"
    fi
}

pick_accel() {
    if [ "$ACCEL" = auto ]; then
        ACCEL=tcg
        if [ -w /dev/kvm ]; then
            local t0 initrd
            t0=$(now)
            initrd=$(make_initrd probe "ROLE=probe
GUEST_WATCHDOG_S=60")
            start_guest probe "$initrd" kvm
            if wait_log "$RUN/probe.console.log" PROBE-OK 60 "$GUEST_PID" 2>/dev/null; then ACCEL=kvm; fi
            wait_exit "$GUEST_PID" 20 || stop_pid "$GUEST_PID"
            note "KVM probe $( [ "$ACCEL" = kvm ] && echo worked || echo "failed, using TCG") ($(elapsed "$t0")s)"
        fi
    fi
    note "accelerator: $ACCEL"
}

start_capture() {
    ip netns exec "$NETNS" tcpdump -Z root -i "$BRIDGE" -U -n -w "$RUN/capture.pcap" udp port "$ROCE_PORT" \
        > "$RUN/tcpdump.log" 2>&1 {LOCK_FD}>&- &
    TCPDUMP_PID=$!
    PIDS+=("$TCPDUMP_PID")
    local i
    for i in $(seq 1 50); do grep -q "listening on" "$RUN/tcpdump.log" && break; sleep 0.2; done
}

stop_capture() {
    [ -n "$TCPDUMP_PID" ] || return 0
    sleep 0.5
    kill -TERM "$TCPDUMP_PID" 2>/dev/null || true
    wait_exit "$TCPDUMP_PID" 10 || stop_pid "$TCPDUMP_PID"
    note "capture: $RUN/capture.pcap ($(grep -oE '[0-9]+ packets captured' "$RUN/tcpdump.log" || echo '? packets'))"
}

guest_report() {   # guest_report ROLE [full]
    local f="$RUN/$1.console.log"
    [ -f "$f" ] || return 0
    grep -E "^\[$1( |\])" "$f" | grep -vE ' note: insmod' | sed 's/^/  /' | tee -a "$SUMMARY"
    if [ "${2:-}" = full ]; then
        grep -E '^    (fio|target log|test|srpd log|srpctl|nbdcheck|verify|check): ' "$f" | tail -n 120 | tee -a "$SUMMARY" || true
        echo "  --- $1 kernel log (srp/rdma lines) ---" | tee -a "$SUMMARY"
        sed -n '/^----- dmesg/,/^----- end dmesg/p' "$f" | grep -E 'srp|rdma|rxe|uverbs|ucm|[Rr]eject|[Ll]ogin|scsi|sd[a-z]\b|WARNING|BUG:|Call Trace|segfault' \
            | grep -vE 'ACPI|^-----' | tail -n 60 | sed 's/^/  /' | tee -a "$SUMMARY"
    fi
}

ctl_send() {       # ctl_send IP TEXT: one control connection to a guest (bounded)
    printf '%s\n' "$2" | nsx timeout 60 bash -c \
        'exec 3<>"/dev/tcp/$0/$1" || exit 1; cat >&3; cat <&3' "$1" "$CTRL_PORT" 2>&1
}

infra_fail() { note "RESULT: ERROR ($*)"; note "logs: $RUN"; exit 3; }

verdict() {        # verdict PASS|FAIL TEXT -> exit 0|1
    if [ "$1" = PASS ]; then note "RESULT: PASS ($2)"; exit 0; fi
    note "RESULT: FAIL ($2)"
    note "logs: $RUN"
    exit 1
}
