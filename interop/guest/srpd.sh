# Shared by the srpd roles (sourced by /etc/srpdtarget.sh and /etc/srpdinitiator.sh): bring up
# the devices srpd needs, write /tmp/srpd.yaml, start the real srpd (built with -tags verbs) on
# it, wait for "srpd started", stop it.
SRPCTL="/opt/srpd/srpctl --socket /tmp/srpd.sock --timeout 20s"

srpd_up() {      # eth0, rxe0 (srpctl link add) and the user-space verbs devices
    net_and_rxe || return 1
    load rdma_cm || return 1
    verbs_up || return 1
    ctl_show link list
}

srpd_conf() {    # /tmp/srpd.yaml: standard input (the role's sections), then control and logging
    { cat; cat <<CONF
control:
  socket: /tmp/srpd.sock
logging:
  level: info
  format: console
CONF
    } > /tmp/srpd.yaml
}

srpd_start() {   # srpd_start SECONDS
    /opt/srpd/srpd -c /tmp/srpd.yaml --log-format console > /tmp/srpd.out 2> /tmp/srpd.log &
    SRPD_PID=$!
    i=0
    while [ "$i" -lt $(($1 * 5)) ]; do
        grep -q 'srpd started' /tmp/srpd.log && return 0
        kill -0 "$SRPD_PID" 2>/dev/null || break
        sleep 0.2; i=$((i + 1))
    done
    log "srpd did not start within ${1}s"
    sed 's/^/    srpd log: /' /tmp/srpd.log | tail -n 40
    return 1
}

srpd_stop() {    # SIGTERM (a drain: logouts, NBD exports closed), 30 s, then SIGKILL; sets SRPD_RC
    stop_proc "$SRPD_PID" srpd 30
    SRPD_RC=$STOPPED_RC
    sed 's/^/    srpd log: /' /tmp/srpd.log | grep -vE 'DEBUG' | tail -n 60
    log "srpd exit $SRPD_RC"
}

ctl_show() {     # ctl_show ARGS...: an srpctl command's output, indented
    echo "    \$ srpctl $*"
    $SRPCTL "$@" 2>&1 | sed 's/^/    srpctl: /'
}
