# srpd initiator role (sourced by /init): the real srpd (-tags verbs) with a transport of driver
# verbs on rxe0 (created with `srpctl link add`) and one session to the SRP target at
# $DEST_IP:$SRP_PORT (srpd with softroce on the host side), its LUN 0 exported over NBD; nbdcheck
# writes, flushes, reads back and compares through the export (two passes) and prints the CHECK
# lines the host verifies on the target; srpd stops with SIGTERM (logout).
. /etc/srpd.sh

role_main() {
    srpd_up || return 1
    wait_for 30 "ping $DEST_IP" ping -c1 -W1 "$DEST_IP" || return 1
    log "$DEST_IP answers ping"
    cd /tmp || return 1
    srpd_conf <<CONF
version: 1
transports:
  - name: rxe
    driver: verbs:rxe0
sessions:
  - name: host
    address: $DEST_IP
    port: $SRP_PORT
    target_port_id: 0x$ID_EXT$IOC_GUID
    connect_timeout: 60s
    nbd:
      - {lun: 0, socket: /tmp/host-lun0.nbd}
CONF
    t0=$(cut -d' ' -f1 /proc/uptime)
    srpd_start 150 || return 1
    t1=$(cut -d' ' -f1 /proc/uptime)
    log "SRPD-STARTED after $(awk "BEGIN{print $t1-$t0}")s"
    ctl_show status
    ctl_show connections
    $SRPCTL connections | grep -q '^host .* running ' || { log "session host is not running"; srpd_stop; return 1; }
    log "IO-START nbdcheck: 2 passes of write/flush/read-back over 5 regions through /tmp/host-lun0.nbd"
    /opt/srpd/nbdcheck -socket /tmp/host-lun0.nbd -passes 2 -timeout 120s > /tmp/checks 2> /tmp/nbdcheck.log
    nrc=$?
    t2=$(cut -d' ' -f1 /proc/uptime)
    sed 's/^/    nbdcheck: /' /tmp/nbdcheck.log
    sed 's/^/    check: /' /tmp/checks
    log "IO-END nbdcheck exit $nrc after $(awk "BEGIN{print $t2-$t1}")s"
    ctl_show connections host
    srpd_stop
    # srpctl's RDMA netlink delete on a kernel that has it: gone, then "not found" (exit 5).
    /opt/srpd/srpctl link delete rxe0 > /tmp/del.out 2>&1; d1=$?
    /opt/srpd/srpctl link delete rxe0 > /tmp/del2.out 2>&1; d2=$?
    sed 's/^/    srpctl: /' /tmp/del.out /tmp/del2.out
    lrc=ok
    if [ "$d1" != 0 ] || [ "$d2" != 5 ] || [ -e /sys/class/infiniband/rxe0 ]; then
        lrc=bad; log "srpctl link delete: exit $d1 then $d2 (want 0 then 5)"
    else
        log "srpctl link delete rxe0: deleted (exit 0), again: not found (exit 5)"
    fi
    [ "$nrc" = 0 ] && grep -q 'nbdcheck: OK' /tmp/nbdcheck.log && [ "$SRPD_RC" = 0 ] && [ "$lrc" = ok ] || return 1
    RESULT=PASS
}
