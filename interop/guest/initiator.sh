# Copied from ../shared/interop/guest/initiator.sh (unchanged below this line, but for
# live_lun_check and its call before the logout, run when LIVE_LUN_WAIT_S is set, and the
# sg3_utils checks of sgchecks.sh, run there when SG_CHECKS=1).
# SRP initiator role (sourced by /init): ib_srp over rxe0, RDMA/CM login to
# $DEST_IP:$SRP_PORT, then a checksummed O_DIRECT workload (and fio if asked).
# When CTRL=1 (kernel-pair) the kernel target guest is told the expected
# hashes over its control channel so that it can check its RAM disk too.

find_srp_disk() {
    for d in /sys/class/scsi_host/host*/device/target*/*/block/*; do
        [ -e "$d" ] || continue
        h=${d#/sys/class/scsi_host/}; h=${h%%/*}
        [ -e "/sys/class/scsi_host/$h/orig_dgid" ] || continue   # SRP hosts only
        basename "$d"; return 0
    done
    return 1
}

CHECKS=/tmp/checks      # "CHECK <sha> <off> <len>" lines for the target guest

role_main() {
    : > "$CHECKS"
    initiator_body; rc=$?
    if [ "${CTRL:-0}" = 1 ] && [ -n "${NET_UP:-}" ]; then
        { [ "$rc" = 0 ] && cat "$CHECKS" || echo "FAIL initiator"; echo END; } \
            | timeout 60 nc "$DEST_IP" "$CTRL_PORT" | sed 's/^/    target says: /' || log "could not reach the target's control port"
    fi
    return "$rc"
}

# login_once: write the login string to add_target in the background and wait
# at most LOGIN_TIMEOUT_S; a hung write (no CM reply) is killed (SIGKILL).
login_once() {
    ( echo "$login" > "$at" ) 2>/tmp/login.err &
    lp=$!
    i=0
    while kill -0 "$lp" 2>/dev/null; do
        if [ "$i" -ge $((LOGIN_TIMEOUT_S * 5)) ]; then
            kill -9 "$lp" 2>/dev/null; wait "$lp" 2>/dev/null
            log "LOGIN-TIMEOUT: add_target did not return within ${LOGIN_TIMEOUT_S}s (no answer to the CM REQ from $DEST_IP:$SRP_PORT?)"
            return 2
        fi
        sleep 0.2; i=$((i + 1))
    done
    wait "$lp"
}

# region list: "offset length" pairs, 4 KiB-aligned, different sizes, one at the end.
regions() {
    echo "0 4096"
    echo "8192 65536"
    echo "1052672 65536"
    echo "4206592 1048576"
    echo "$((DISK_BYTES - 4096)) 4096"
}

dd_pass() {
    p=$1
    n=0
    regions > /tmp/regions
    while read -r off len; do
        n=$((n + 1))
        dd if=/dev/urandom of="/tmp/pat.$n" bs="$len" count=1 2>/dev/null
        if ! dd if="/tmp/pat.$n" of="/dev/$disk" bs="$len" count=1 seek="$off" oflag=seek_bytes,direct conv=fsync 2>/tmp/dd.err; then
            log "IO-ERROR pass $p write $len bytes at $off: $(tr '\n' ' ' < /tmp/dd.err)"; return 1
        fi
    done < /tmp/regions
    echo 3 > /proc/sys/vm/drop_caches
    n=0; bad=0
    : > "$CHECKS"
    while read -r off len; do
        n=$((n + 1))
        if ! dd if="/dev/$disk" of=/tmp/rb bs="$len" count=1 skip="$off" iflag=skip_bytes,direct 2>/tmp/dd.err; then
            log "IO-ERROR pass $p read $len bytes at $off: $(tr '\n' ' ' < /tmp/dd.err)"; return 1
        fi
        want=$(sha256sum < "/tmp/pat.$n" | cut -d' ' -f1)
        got=$(sha256sum < /tmp/rb | cut -d' ' -f1)
        if [ "$want" = "$got" ]; then
            log "  pass $p: $len bytes at offset $off: match ($want)"
        else
            log "  pass $p: $len bytes at offset $off: MISMATCH want $want got $got"; bad=1
        fi
        echo "CHECK $want $off $len" >> "$CHECKS"
    done < /tmp/regions
    [ "$bad" = 0 ]
}

# live_lun_check: the target adds LUN 1 while this session is logged in (srpd with
# scripts/interop-srpd.sh target-addlun). The kernel gets REPORTED LUNS DATA HAS CHANGED on its
# next command and logs it (scsi_report_lun_change), but only a scan adds the disk: scan the SRP
# host (REPORT LUNS) until LUN 1 appears, read it, and check it is the same session (one remote
# port, the same one, no reconnect in the kernel log).
live_lun_check() {
    port0=$(ls /sys/class/srp_remote_ports)
    host=""
    for h in /sys/class/scsi_host/host*; do [ -e "$h/orig_dgid" ] && host=$(basename "$h"); done
    [ -n "$host" ] || { log "LIVE-LUN-FAIL: no SRP SCSI host"; return 1; }
    dd if="/dev/$disk" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null # a command to carry the unit attention
    t0=$(cut -d' ' -f1 /proc/uptime)
    dev=""; i=0
    while [ -z "$dev" ] && [ "$i" -lt $((LIVE_LUN_WAIT_S * 2)) ]; do
        echo "- - -" > "/sys/class/scsi_host/$host/scan"
        for d in /sys/class/scsi_host/$host/device/target*/*:*:*:1/block/*; do
            [ -e "$d" ] && dev=$(basename "$d")
        done
        [ -n "$dev" ] || { sleep 0.5; i=$((i + 1)); }
    done
    [ -n "$dev" ] || { log "LIVE-LUN-FAIL: no LUN 1 after ${LIVE_LUN_WAIT_S}s of scans"; return 1; }
    t1=$(cut -d' ' -f1 /proc/uptime)
    wait_for 10 "/dev/$dev" test -b "/dev/$dev" || return 1
    bytes=$(($(cat "/sys/block/$dev/size") * 512))
    if ! dd if="/dev/$dev" of=/dev/null bs=1048576 count=1 iflag=direct 2>/tmp/dd.err; then
        log "LIVE-LUN-FAIL: reading /dev/$dev: $(tr '\n' ' ' < /tmp/dd.err)"; return 1
    fi
    port1=$(ls /sys/class/srp_remote_ports)
    logins=$(dmesg | grep -c 'ib_srp: new target')
    reconnects=$(dmesg | grep -c 'ib_srp: reconnect succeeded')
    if [ "$port1" != "$port0" ] || [ "$logins" != 1 ] || [ "$reconnects" != 0 ]; then
        log "LIVE-LUN-FAIL: not the same session (remote ports '$port0' -> '$port1', $logins logins, $reconnects reconnects)"
        return 1
    fi
    dmesg | grep -iE 'LUN assignments|reported luns|scsi 0:0:0:1|sd 0:0:0:1' | tail -n 4 | sed 's/^/    /'
    log "LIVE-LUN-OK /dev/$dev (LUN 1, $bytes bytes) found $(awk "BEGIN{print $t1-$t0}")s after the first scan, read, same session ($port1)"
}

run_fio() {
    [ -x /usr/bin/fio ] || { log "FIO requested but fio is not in the image (install fio on the host, rerun setup)"; return 1; }
    # from 8 MiB on, clear of the dd regions (so kernel-pair's target-side check still holds)
    size=$(( (DISK_BYTES - 9 * 1048576) / 1048576 * 1048576 ))
    [ "$size" -gt $((32 * 1048576)) ] && size=$((32 * 1048576))
    [ "$size" -ge 1048576 ] || { log "disk too small for the fio job (need >= 10 MiB)"; return 1; }
    log "FIO-START randwrite+verify offset=8MiB size=$size bssplit 4k/50:64k/40:256k/10 iodepth=16 libaio"
    fio --name=srpi-verify --filename="/dev/$disk" --thread --direct=1 --ioengine=libaio \
        --iodepth=16 --rw=randwrite --bssplit=4k/50:64k/40:256k/10 --offset=8M --size="$size" \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1 \
        --output=/tmp/fio.out > /tmp/fio.stdout 2>&1
    frc=$?
    sed 's/^/    fio: /' /tmp/fio.out /tmp/fio.stdout | grep -vE '^    fio: *$' | head -n 60
    if [ "$frc" = 0 ]; then log "FIO-PASS"; else log "FIO-FAIL (exit $frc)"; fi
    return "$frc"
}

initiator_body() {
    net_and_rxe || return 1
    NET_UP=1
    load crct10dif_generic || return 1
    load crc64_rocksoft_generic || return 1
    load sd_mod || return 1
    load rdma_cm || return 1
    load ib_srp || return 1
    at=/sys/class/infiniband_srp/srp-rxe0-1/add_target
    wait_for 30 "$at" test -e "$at" || return 1
    wait_for 30 "ping $DEST_IP" ping -c1 -W1 "$DEST_IP" || return 1
    log "$DEST_IP answers ping"

    login="id_ext=$ID_EXT,ioc_guid=$IOC_GUID,dest=$DEST_IP:$SRP_PORT${LOGIN_OPTS:+,$LOGIN_OPTS}"
    log "LOGIN-START echo '$login' > $at"
    t0=$(cut -d' ' -f1 /proc/uptime)
    tries=1
    while :; do
        login_once; lrc=$?
        [ "$lrc" = 0 ] && break
        [ "$lrc" = 2 ] && return 1
        log "add_target failed (try $tries): $(tr '\n' ' ' < /tmp/login.err)"
        dmesg | grep -iE 'srp' | tail -n 5 | sed 's/^/    /'
        [ "$tries" -ge 3 ] && { log "LOGIN-FAILED after $tries tries"; return 1; }
        tries=$((tries + 1)); sleep 2
    done
    t1=$(cut -d' ' -f1 /proc/uptime)
    log "LOGIN-OK add_target returned after $(awk "BEGIN{print $t1-$t0}")s (try $tries)"
    wait_for 60 "SRP SCSI disk" find_srp_disk || return 1
    disk=$(find_srp_disk)
    wait_for 10 "/dev/$disk" test -b "/dev/$disk" || return 1
    DISK_BYTES=$(($(cat "/sys/block/$disk/size") * 512))
    t2=$(cut -d' ' -f1 /proc/uptime)
    log "DISK-UP /dev/$disk after $(awk "BEGIN{print $t2-$t0}")s: $DISK_BYTES bytes, lbs $(cat /sys/block/$disk/queue/logical_block_size), vendor '$(cat /sys/block/$disk/device/vendor)' model '$(cat /sys/block/$disk/device/model)' max_sectors_kb $(cat /sys/block/$disk/queue/max_sectors_kb)"
    for f in /sys/class/srp_remote_ports/*/port_id /sys/class/scsi_host/host*/sgid /sys/class/scsi_host/host*/req_lim /sys/class/scsi_host/host*/ch_count /sys/class/scsi_host/host*/can_queue; do
        [ -e "$f" ] && log "  $f = $(cat "$f" 2>/dev/null)"
    done
    [ "$DISK_BYTES" -ge $((8 * 1048576)) ] || { log "disk too small for the workload (need >= 8 MiB)"; return 1; }

    RESULT=PASS
    log "IO-START pass 1: O_DIRECT write + read-back of 4 KiB/64 KiB/1 MiB regions"
    dd_pass 1 || RESULT=FAIL
    log "IO-START pass 2: overwrite the same regions with new data, read back"
    [ "$RESULT" = PASS ] && { dd_pass 2 || RESULT=FAIL; }
    [ "$RESULT" = PASS ] && log "IO-MATCH (2 passes x $(wc -l < /tmp/regions) regions)"
    if [ "$RESULT" = PASS ] && [ "${FIO:-0}" = 1 ]; then
        run_fio || RESULT=FAIL
    fi

    if [ "$RESULT" = PASS ] && [ -n "${LIVE_LUN_WAIT_S:-}" ]; then
        live_lun_check || RESULT=FAIL
    fi
    if [ "$RESULT" = PASS ] && [ "${SG_CHECKS:-0}" = 1 ]; then
        . /etc/sgchecks.sh
        sg_checks || RESULT=FAIL
    fi
    for p in /sys/class/srp_remote_ports/*; do [ -e "$p/delete" ] && echo 1 > "$p/delete"; done
    wait_for 20 "logout" sh -c '! ls /sys/class/srp_remote_ports/* >/dev/null 2>&1' || true
    log "logged out"
    [ "$RESULT" = PASS ]
}
