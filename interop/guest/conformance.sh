# Conformance role (sourced by /init): the transport conformance suite and the engine's own tests
# (/opt/srpd/verbs.test, built with `go test -c -tags verbs ./transport/verbs`) on rxe0.
role_main() {
    net_and_rxe || return 1
    load rdma_cm || return 1
    verbs_up || return 1
    log "TEST-START verbs.test -test.v -test.timeout ${TEST_TIMEOUT_S}s ${TEST_RUN:+-test.run $TEST_RUN}"
    t0=$(cut -d' ' -f1 /proc/uptime)
    cd /tmp || return 1
    SRPD_VERBS_DEVICE=rxe0 /opt/srpd/verbs.test -test.v -test.timeout "${TEST_TIMEOUT_S}s" \
        ${TEST_RUN:+-test.run "$TEST_RUN"} > /tmp/test.log 2>&1
    rc=$?
    t1=$(cut -d' ' -f1 /proc/uptime)
    sed 's/^/    test: /' /tmp/test.log
    log "TEST-END exit $rc after $(awk "BEGIN{print $t1-$t0}")s: $(grep -c -- '--- PASS' /tmp/test.log) passed, $(grep -c -- '--- FAIL' /tmp/test.log) failed, $(grep -c -- '--- SKIP' /tmp/test.log) skipped"
    if grep -q 'SKIPPED: no usable RDMA device' /tmp/test.log; then
        log "TEST-NO-DEVICE: the suite did not find rxe0"; return 1
    fi
    [ "$rc" = 0 ] || return 1
    RESULT=PASS
}
