# srpd target role (sourced by /init): the real srpd (-tags verbs) with a transport of driver
# verbs on rxe0 (created with `srpctl link add`), a target with a RAM LUN for any initiator, and
# a session of its own to that target (over rxe0's loopback) that exports the LUN over NBD.
# After SRPD-TARGET-READY it serves one control connection on TCP $CTRL_PORT: the kernel
# initiator (CTRL=1) sends the CHECK lines of what it wrote, then END; the data is then read
# back through srpd's own session and NBD export (nbdcheck -verify), and srpd is stopped.
. /etc/srpd.sh

role_main() {
    srpd_up || return 1
    cd /tmp || return 1
    srpd_conf <<CONF
version: 1
transports:
  - name: rxe
    driver: verbs
    device: rxe0
targets:
  - name: ram
    port_id: 0x$ID_EXT$IOC_GUID
    cm_port: $SRP_PORT
    luns:
      - {id: 0, backend: ram, size: ${LUN_MB}MiB}
    acls:
      - initiator: "*"
sessions:
  - name: self
    address: $MY_IP
    port: $SRP_PORT
    target_port_id: 0x$ID_EXT$IOC_GUID
    nbd:
      - {lun: 0, socket: /tmp/self-lun0.nbd}
CONF
    srpd_start 90 || return 1
    ctl_show status
    ctl_show connections
    log "SRPD-TARGET-READY ip=$MY_IP port=$SRP_PORT port_id=$ID_EXT$IOC_GUID"
    : > /tmp/ctl.status
    : > /tmp/ctl.checks
    : > /tmp/ctl.sessions
    # While the control connection is awaited: keep the session list that shows the kernel
    # initiator (its remote address is not ours).
    ( while :; do
        $SRPCTL session list > /tmp/sl.tmp 2>&1
        grep -qE "^ram\.[0-9]+ .* [0-9.]+:[0-9]+ " /tmp/sl.tmp && ! [ -s /tmp/ctl.sessions ] && \
            grep -vE " $MY_IP:[0-9]+ " /tmp/sl.tmp | grep -q "^ram\." && cp /tmp/sl.tmp /tmp/ctl.sessions
        sleep 2
      done ) &
    poller=$!
    timeout "$TARGET_WAIT_S" nc -l -p "$CTRL_PORT" -e /bin/srpv-ctl || true
    kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null
    alive=yes; kill -0 "$SRPD_PID" 2>/dev/null || alive=no
    if [ -s /tmp/ctl.sessions ]; then
        log "the kernel initiator's session, as srpctl listed it while it was logged in:"
        sed 's/^/    srpctl: /' /tmp/ctl.sessions
    else
        log "note: srpctl session list never showed the kernel initiator's session (polled every 2 s)"
    fi
    ctl_show target show ram
    ctl_show session list
    ok=yes
    if [ -s /tmp/ctl.checks ] && ! grep -q '^FAIL' /tmp/ctl.status; then
        if /opt/srpd/nbdcheck -socket /tmp/self-lun0.nbd -verify /tmp/ctl.checks -timeout 60s 2> /tmp/verify.log; then
            log "TARGET-DATA-VERIFIED through srpd's own session and NBD export: $(grep -c . /tmp/ctl.checks) region(s)"
        else
            ok=no; log "TARGET-DATA-MISMATCH"
        fi
        sed 's/^/    verify: /' /tmp/verify.log
    else
        ok=no; log "no CHECK lines from the initiator ($(tr '\n' ' ' < /tmp/ctl.status))"
    fi
    srpd_stop
    grep -q '^END' /tmp/ctl.status || { log "TARGET-CTL-TIMEOUT"; return 1; }
    [ "$alive" = yes ] && [ "$SRPD_RC" = 0 ] && [ "$ok" = yes ] || return 1
    RESULT=PASS
}
