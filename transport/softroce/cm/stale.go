package cm

import "net/netip"

// StaleConn identifies a connection an earlier instance of this process established and
// could not disconnect (it was killed): the addresses and communication IDs of both ends and
// the peer's QPN, which is what a DREQ must carry for the peer's CM to find its side.
type StaleConn struct {
	Local, Remote netip.Addr
	// LocalCommID is the earlier instance's communication ID, RemoteCommID the peer's.
	LocalCommID, RemoteCommID uint32
	// RemoteQPN is the peer's QP number: cm.c cm_dreq_handler ignores a DREQ whose Remote
	// QPN is not the local QPN of the connection it names.
	RemoteQPN uint32
}

// StaleDREQ emits a DREQ for s, a connection this Manager has no record of, so that the peer
// tears its side down at once (torvalds/linux drivers/infiniband/core/cm.c cm_dreq_handler:
// found by (remote, local) communication ID, checked against its QPN, answered with a DREP
// and reported as IB_CM_DREQ_RECEIVED, which rdma_cm turns into RDMA_CM_EVENT_DISCONNECTED
// and ib_srp into a transport-layer error and a reconnect after reconnect_delay) instead of
// finding out through SCSI timeouts. Nothing is retransmitted and no state is kept: the
// peer's DREP (or its REJ) finds no connection here and is dropped; a caller that wants
// retries calls again. The TID is formed as ib_send_cm_dreq does, from the old communication ID.
func (m *Manager) StaleDREQ(s StaleConn, out *Outputs) {
	r := DREQ(out.mad(0, s.Local, s.Remote, AttrDREQ, TID(m.cfg.HiTID, s.LocalCommID)))
	r.SetLocalCommID(s.LocalCommID)
	r.SetRemoteCommID(s.RemoteCommID)
	r.SetRemoteQPN(s.RemoteQPN)
}
