# Verbs initiator role (sourced by /init): /opt/srpd/verbs-srpinitiator (package initiator on the
# kernel verbs engine, fast registration through type-2 memory windows) logs in to the SRP target
# at $DEST_IP:$SRP_PORT, writes, flushes, reads back and compares, and logs out.
role_main() {
    net_and_rxe || return 1
    load rdma_cm || return 1
    verbs_up || return 1
    wait_for 30 "ping $DEST_IP" ping -c1 -W1 "$DEST_IP" || return 1
    log "$DEST_IP answers ping; INITIATOR-START"
    cd /tmp || return 1
    t0=$(cut -d' ' -f1 /proc/uptime)
    SRPD_VERBS_DEVICE=rxe0 /opt/srpd/verbs-srpinitiator -target "$DEST_IP" -port "$SRP_PORT" \
        -port-id "$ID_EXT$IOC_GUID" -timeout "${INI_TIMEOUT_S}s" > /tmp/ini.out 2> /tmp/ini.log
    rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    sed 's/^/    initiator log: /' /tmp/ini.log | tail -n 60
    sed 's/^/    initiator out: /' /tmp/ini.out
    log "INITIATOR-END exit $rc after $(awk "BEGIN{print $t1-$t0}")s"
    [ "$rc" = 0 ] && grep -q 'verbs-srpinitiator: OK' /tmp/ini.log || return 1
    RESULT=PASS
}
