// Package cm is softroce's connection manager: the Linux IB CM (torvalds/linux:
// drivers/infiniband/core/cm.c) with the RDMA CM conventions of cma.c on top, as a pure,
// deterministic state machine, plus zero-allocation views of every CM message.
//
// # Integration note for the engine (QP1 wiring)
//
// One Manager per device, created with NewManager(Config{GUID: <the device's EUI-64>}). It is
// not safe for concurrent use: call it from the engine's receive loop and timer loop under one
// mutex (or from one goroutine). Keep one *Outputs per caller and Reset it before each call.
// Time is a monotonic time.Duration (e.g. time.Since(deviceStart)); the Manager never reads a
// clock.
//
// Receive. In the receive loop, a packet with BTH opcode UD_SEND_ONLY (0x64) and DestQP 1 is a
// MAD: check BTH P_Key (0xFFFF, low 15 bits 0x7FFF), DETH Q_Key == 0x80010000
// (wire.GSIQKey) and payload length == 256, then call
//
//	out.Reset()
//	err := mgr.HandleMAD(now, pkt.Src.Addr(), pkt.Dst.Addr(), pkt.Payload(), out)
//
// (err ≠ nil only counts a malformed MAD; nothing else to do.) wire.Packet.MAD() returns the
// payload view. The packet's source IP is where answers go; its destination IP is ours.
//
// Timers. After every Manager call, re-arm the engine's timer from mgr.NextDeadline(); when it
// fires call mgr.Expire(now, out) (it handles everything due, in deadline order) and process
// out like any other.
//
// Processing out, in this order:
//
//  1. out.QP: for each u, look up the QP by u.QPN and apply qp.Modify(&u.Attr, u.Mask). They
//     come in RESET/INIT→INIT, →RTR, →RTS order (Accept; REP received) or →ERR. If a Modify
//     fails, drop this Outputs' MADs for u.Conn and call mgr.Destroy(now, u.Conn, out2).
//  2. out.MADs: each is one UD packet: Src → Dst:4791 with wire.Layout(buf, wire.UDSendOnly,
//     256); BTH: P_Key 0xFFFF, DestQP 1, AckReq 1 (as rxe sends its MADs), PSN = QP1's
//     24-bit send counter (+1 per MAD), SE/M/PadCnt/TVer 0; DETH: Q_Key 0x80010000, SrcQP 1;
//     payload = m.MAD[:] (256 bytes); the link writes the ICRC. IP TTL 64, TOS 0.
//  3. out.Events: deliver to the ULP (transport.ConnManager implementation). PrivateData and
//     ARI slices are only valid until out.Reset, so copy what is kept. EventRequest →
//     Listener.Accept returns a ConnRequest whose Accept calls mgr.Accept(now, id,
//     &AcceptParams{QPN: qp.QPN(), ...}, out) and whose Reject calls mgr.Reject; Dial calls
//     mgr.Dial(now, &DialParams{LocalAddr, RemoteAddr, DstPort, QPN: qp.QPN(), ...}, out) and
//     waits for EventEstablished (conn ready; REP private data), EventRejected (return
//     &transport.RejectError{Reason, PrivateData, ARI}) or EventUnreachable
//     (transport.ErrConnUnreachable); on ctx cancellation it calls mgr.Destroy. EventDisconnected
//     and EventTimewaitExit go to CMConn.Events(). CMConn.Disconnect calls mgr.Disconnect.
//  4. out.Timers is informational (the Manager keeps the timers); only NextDeadline matters.
//
// Optional: when a QP whose connection is in REP_SENT receives its first RC packet
// (IB_EVENT_COMM_EST), call mgr.CommEstablished(now, id, out): the peer is evidently
// established although its RTU was lost.
//
// # Wire behaviour
//
// Messages are formatted and interpreted exactly as cm.c does (field locations from
// torvalds/linux:include/rdma/ibta_vol1_c12.h; IBA_GET/IBA_SET semantics from
// include/rdma/iba.h); the tests decode the kernel exchanges in ../testdata field by field
// against tshark and re-encode them byte for byte. Notable points:
//
//   - TIDs: messages we originate (REQ, DREQ) carry cm_form_tid's value, hi_tid << 32 |
//     the local comm ID byte-swapped (the kernel reinterprets the __be32 as a host u32 on
//     x86); REP, REJ, MRA and RTU echo the REQ's TID, DREP the DREQ's.
//   - REQ when dialling (cma_resolve_iboe_route + cm_format_req): LIDs 0xFFFF and Subnet Local
//     0 (hop limit 64 > 1), GIDs = IPs (IPv4-mapped), flow label (sport*31+dport)&0xFFFFF,
//     packet rate 0, SL 0, P_Key 0xFFFF, Local ACK Timeout cm_ack_timeout(15, 18) = 19, CM
//     response timeouts 20, Max CM Retries 15, RDMA CM header + ULP data, service ID
//     0x0000000001060000 | port.
//   - REP when accepting (cma_accept_ib + cm_format_rep): our random 24-bit starting PSN,
//     Target ACK Delay 15, RNR retry 7, failover 0, our GUID, initiator depth ≥ 1 whenever the
//     peer offers responder resources (so our RDMA READs are legal) and never above its offer.
//   - PSN direction: REQ Starting PSN is the dialler's rq_psn and the acceptor's sq_psn; REP
//     Starting PSN the reverse.
//   - Timers: REQ every 2×ms(packet life)+ms(remote CM response timeout) (6.144 s with the
//     defaults), REP and DREQ every ms(REQ Local CM Response Timeout) on the accepting side,
//     each with Max CM Retries resends; an MRA extends the pending message's timeout to
//     ms(service timeout)+ms(av.timeout); timewait lasts ms(local ACK timeout).
//   - Duplicates: a REQ while the ULP decides gets an MRA (service timeout 24, what RDMA CM's
//     delayed MRA sends); a REQ after our REP gets the REP again (the kernel would wait for its
//     REP timeout); a REQ of a connection in timewait gets REJ 10; a REP once established gets
//     the RTU again; a DREQ for an unknown connection still gets a DREP; a DREQ naming another
//     QPN is ignored; a REQ or REP reusing a (CA GUID, QPN) we still hold gets REJ 10 and the
//     old connection a DREQ.
//   - No listener on the port: REJ 8 (invalid service ID). Listener on the port but not on the
//     RDMA CM header's destination address, bad header or non-RC: REJ 28 without private data.
//   - SIDR_REQ: SIDR_REP "unsupported". LAP: APR "unsupported" for a known connection (the
//     kernel drops LAPs on RoCE). SIDR_REP, APR: dropped.
//   - Deviation kept on purpose: the (CA GUID, comm ID) and (CA GUID, QPN) of a connection stay
//     indexed through timewait (IBA semantics; newer kernels drop them on entering timewait),
//     so stale REQs are recognised until timewait ends.
package cm
