# shellcheck shell=bash
# Settings and helpers of interop/srp-verbs (sourced, not run). Adapted from
# ../shared/interop/lib/common.sh: the same rules (private namespace, bounded waits, teardown,
# only PIDs we started), but its own cache, output folder, namespace and lock, so that it never
# touches a run of ../shared/interop/srp-interop. The Debian kernel is read from that tool's cache
# (SRP_INTEROP_CACHE); `srp-verbs setup` runs `srp-interop setup` once if it is not there.

# ---- locations -------------------------------------------------------------------------------
# SRPV_DIR (the folder holding srp-verbs) and REPO are set by the entry script.
CACHE="${SRP_VERBS_CACHE:-/var/tmp/srp-verbs}"
OUT="${SRP_VERBS_OUT:-$CACHE/out}"
SHARED_INTEROP="${INTEROP:-$REPO/../shared/interop}"
KCACHE="${SRP_INTEROP_CACHE:-/var/tmp/srp-interop}"   # the shared tool's cache (kernel only)
KROOT="$KCACHE/kernel"
IMGDIR="$CACHE/images"
BINDIR="$CACHE/bin"                                     # the Go binaries put into the guests

# ---- network (only inside the namespace this tool creates) -----------------------------------
NETNS="${SRP_VERBS_NETNS:-srp-verbs}"
BRIDGE=br-srpv
TAP_TGT=tap-srpv-t
TAP_INI=tap-srpv-i
PREFIX=24
TGT_IP=10.77.0.1                 # the guest running our verbs binary (target / conformance)
INI_IP=10.77.0.2                 # the guest running the kernel's ib_srp
HOST_IP=10.77.0.3                # bridge address (control channel to the guests)
TGT_MAC=52:54:00:77:00:01
INI_MAC=52:54:00:77:00:02
SRP_PORT=5555
CTRL_PORT=5000
ROCE_PORT=4791
ID_EXT="${SRP_INTEROP_ID_EXT:-5352500000000003}"
IOC_GUID="${SRP_INTEROP_IOC_GUID:-5352500000000003}"
SG_NAA=6001405abcdef0123456789abcdef012   # sg-checks: LUN 0's naa, read back in VPD page 0x83

# ---- knobs ---------------------------------------------------------------------------------
ACCEL="${SRP_INTEROP_ACCEL:-auto}"
BOOT_TIMEOUT_S="${SRP_INTEROP_BOOT_TIMEOUT_S:-300}"
RUN_TIMEOUT_S="${SRP_INTEROP_RUN_TIMEOUT_S:-900}"
LOGIN_TIMEOUT_S="${SRP_INTEROP_LOGIN_TIMEOUT_S:-60}"
LOGIN_OPTS="${SRP_INTEROP_LOGIN_OPTS:-}"
FIO="${SRP_INTEROP_FIO:-0}"
GUEST_CPUS="${SRP_INTEROP_GUEST_CPUS:-1}"
GUEST_MEM_MB="${SRP_INTEROP_GUEST_MEM_MB:-768}"
LOCK_WAIT_S="${SRP_INTEROP_LOCK_WAIT_S:-900}"
TEST_TIMEOUT_S="${SRP_VERBS_TEST_TIMEOUT_S:-600}"      # the conformance binary's -test.timeout
TEST_RUN="${SRP_VERBS_TEST_RUN:-}"                     # -test.run for the conformance binary
# SRP_VERBS_RACE=1 builds the conformance binary with -race (read by srp-verbs' build_bins).

# ---- small helpers -------------------------------------------------------------------------
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
die() { echo "srp-verbs: $*" >&2; exit 2; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, taps, apt)"; }

take_lock() {
    mkdir -p "$CACHE"
    exec {LOCK_FD}>"$CACHE/.lock"
    flock -w "$LOCK_WAIT_S" "$LOCK_FD" || die "another srp-verbs run holds $CACHE/.lock"
}

kver() { cat "$KCACHE/KVER"; }
