# Verbs target role (sourced by /init): /opt/srpd/verbs-srptarget (package target on the kernel
# verbs engine) listens on rxe0 at $MY_IP:$SRP_PORT. After VERBS-TARGET-READY it serves one
# control connection on TCP $CTRL_PORT (END: stop), then stops the target with SIGTERM.
role_main() {
    net_and_rxe || return 1
    load rdma_cm || return 1
    verbs_up || return 1
    cd /tmp || return 1
    SRPD_VERBS_DEVICE=rxe0 /opt/srpd/verbs-srptarget -addr "$MY_IP" -port "$SRP_PORT" \
        -port-id "$ID_EXT$IOC_GUID" -lun-mib "$LUN_MB" > /tmp/target.out 2> /tmp/target.log &
    tp=$!
    if ! wait_for 60 "verbs-srptarget ready" grep -q VERBS-TARGET-READY /tmp/target.out; then
        sed 's/^/    target log: /' /tmp/target.log | tail -n 40
        kill -9 "$tp" 2>/dev/null
        return 1
    fi
    log "VERBS-TARGET-READY ip=$MY_IP port=$SRP_PORT port_id=$ID_EXT$IOC_GUID"
    : > /tmp/ctl.status
    timeout "$TARGET_WAIT_S" nc -l -p "$CTRL_PORT" -e /bin/srpv-ctl || true
    alive=yes; kill -0 "$tp" 2>/dev/null || alive=no
    stop_proc "$tp" verbs-srptarget 10
    trc=$STOPPED_RC
    sed 's/^/    target log: /' /tmp/target.log | grep -vE 'DEBUG' | tail -n 60
    log "verbs-srptarget exit $trc (alive until END: $alive)"
    grep -q '^END' /tmp/ctl.status || { log "TARGET-CTL-TIMEOUT"; return 1; }
    [ "$alive" = yes ] && [ "$trc" = 0 ] || return 1
    RESULT=PASS
}
