# sg3_utils against the SRP disk (sourced by initiator.sh when SG_CHECKS=1, after the checksummed
# workload, before the logout). The guest only runs the commands and frames their output for the
# host, which parses it (interop/lib/sgcheck.sh): every command's output is printed between
#     SG-BEGIN <name>: <command line>
#         sg| <output line>
#     SG-END <name> rc=<exit status>
# The live ALUA part asks the host for a state change with a line "SG-ALUA-WANT <state>" (the host
# watches this console and runs srpctl target alua), then polls REPORT TARGET PORT GROUPS until
# the local group (SG_GROUP) shows it, bounded by SG_ALUA_WAIT_S.

SG_GROUP=${SG_GROUP:-1}
SG_ALUA_WAIT_S=${SG_ALUA_WAIT_S:-60}

# sg_run NAME CMD...: CMD's output, framed; returns its exit status.
sg_run() {
    name=$1; shift
    echo "SG-BEGIN $name: $*"
    "$@" > /tmp/sg.out 2>&1; src=$?
    sed 's/^/    sg| /' /tmp/sg.out
    echo "SG-END $name rc=$src"
    return "$src"
}

# group_state: the local group's state as sg_rtpg --decode prints it ("active/optimized",
# "standby", ...), from the last sg_rtpg output in /tmp/sg.out; empty if not there.
group_state() {
    awk -v g="$SG_GROUP" '
        /target port group id *:/ { s = $0; sub(/.*id *: */, "", s); sub(/ *,.*/, "", s); cur = (s + 0 == g || s == sprintf("0x%x", g)) }
        cur && /asymmetric access state/ { s = $0; sub(/.*\(/, "", s); sub(/\).*/, "", s); print s; exit }' /tmp/sg.out
}

# alua_to STATE: ask the host for STATE, wait until RTPG reports it (unit attentions retried;
# the first one framed as ua-STATE), then TEST UNIT READY until it answers without a unit
# attention (sg3_utils exit 6); the last RTPG and TUR outputs are framed as rtpg-STATE and
# turs-STATE (STATE with / as -).
alua_to() {
    want=$1; tag=$(echo "$1" | tr / -)
    log "SG-ALUA-WANT $want"
    i=0; got=""; ua=0
    while [ "$i" -lt $((SG_ALUA_WAIT_S * 2)) ]; do
        sg_rtpg -vv --decode "/dev/$disk" > /tmp/sg.out 2>&1; rrc=$?
        if [ "$rrc" = 6 ] && [ "$ua" = 0 ]; then  # the first unit attention, for the host to check
            ua=1
            echo "SG-BEGIN ua-$tag: sg_rtpg -vv --decode /dev/$disk"
            sed 's/^/    sg| /' /tmp/sg.out
            echo "SG-END ua-$tag rc=$rrc"
        fi
        got=$(group_state)
        [ "$got" = "$want" ] && break
        sleep 0.5; i=$((i + 1))
    done
    [ "$got" = "$want" ] || log "SG-ALUA-TIMEOUT: group $SG_GROUP still '$got' after ${SG_ALUA_WAIT_S}s, wanted '$want'"
    log "SG-ALUA-SEEN $want after $(awk "BEGIN{print $i/2}")s"
    sg_run "rtpg-$tag" sg_rtpg --decode "/dev/$disk"
    i=0
    while [ "$i" -lt 5 ]; do
        sg_turs -vv "/dev/$disk" > /tmp/sg.out 2>&1; trc=$?
        [ "$trc" = 6 ] || break
        sed 's/^/    sg-ua| /' /tmp/sg.out
        i=$((i + 1))
    done
    sg_run "turs-$tag" sg_turs -vv "/dev/$disk"
}

sg_checks() {
    dev=/dev/$disk
    blocks=$(($(cat "/sys/block/$disk/size") * 512 / $(cat "/sys/block/$disk/queue/logical_block_size")))
    log "SG-CHECKS-START on $dev ($blocks blocks)"
    # Everything once with the disk as it is: group 1 active/optimized, the workload's regions
    # written (allocated in the sparse file), the rest never written (holes).
    sg_run inq sg_inq "$dev"
    sg_run rtpg sg_rtpg --decode "$dev"
    sg_run rtpg-ext sg_rtpg --decode --extended "$dev"
    sg_run vpd83 sg_vpd --page=0x83 "$dev"
    sg_run vpd86 sg_vpd --page=0x86 "$dev"
    sg_run mode01 sg_modes --page=1 "$dev"
    sg_run opcodes sg_opcodes "$dev"
    sg_run opcode-rtpg sg_opcodes --opcode=0xa3,0xa "$dev"
    sg_run tmf sg_opcodes --tmf "$dev"
    sg_run tmf-repd sg_opcodes --tmf --repd "$dev"
    sg_run logs sg_logs "$dev"
    sg_run logs-all sg_logs --page=0x0,0xff "$dev"
    sg_run logs0c sg_logs --page=0x0c "$dev"
    # LBA 0 (written by the workload), the middle of the disk (never written), the last 4 KiB
    # (written).
    sg_run lba-first sg_get_lba_status --lba=0 --maxlen=104 "$dev"
    sg_run lba-middle sg_get_lba_status --lba=$((blocks / 2)) --maxlen=104 "$dev"
    sg_run lba-last sg_get_lba_status --lba=$((blocks - 4096 / $(cat "/sys/block/$disk/queue/logical_block_size"))) "$dev"
    # REPORT TYPE: only the mapped (2), only the deallocated (3) ranges.
    sg_run lba-mapped sg_get_lba_status --report-type=2 --lba=0 --maxlen=104 "$dev"
    sg_run lba-deallocated sg_get_lba_status --report-type=3 --lba=0 --maxlen=104 "$dev"
    # Live: standby (RTPG shows it, TEST UNIT READY gets NOT READY 04/0B), then back.
    alua_to standby
    # In standby (spc4r37 5.15.2.4.4; LIO's core_alua_state_standby): INQUIRY, REPORT LUNS, LOG
    # SENSE, MODE SENSE and READ CAPACITY answer; media access (GET LBA STATUS, READ) gets
    # NOT READY 04/0B.
    sg_run sb-inq sg_inq "$dev"
    sg_run sb-luns sg_luns "$dev"
    sg_run sb-readcap sg_readcap --16 "$dev"
    sg_run sb-logs0c sg_logs --page=0x0c "$dev"
    sg_run sb-mode01 sg_modes --page=1 "$dev"
    sg_run sb-lba sg_get_lba_status -vv --lba=0 "$dev"
    sg_run sb-read sg_dd -vv if="$dev" of=/dev/null bs=512 count=8 blk_sgio=1
    alua_to active/optimized
    log "SG-CHECKS-END"
}
