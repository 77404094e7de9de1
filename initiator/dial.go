package initiator

import (
	"context"
	"net/netip"

	"github.com/srpd/srpd/transport"
)

// Dialer connects one channel's queue pair to the target. It is the seam between the SRP login
// and connection management: the session builds the SRP_LOGIN_REQ (privateData: the 56-byte
// RDMA CM form or the 64-byte form, as Config.LoginForm says) and hands it over with a QP in
// RESET; the Dialer carries it in the connection request and returns the established connection,
// whose PrivateData is the target's SRP_LOGIN_RSP.
//
// A rejected login must be returned as a *transport.RejectError whose PrivateData holds the
// SRP_LOGIN_REJ (reason transport.RejectConsumerDefined); the session turns it into a
// *LoginRejectError. Any other error is a connection failure (retried with back-off on
// reconnects).
//
// After a successful Dial the connection's Events channel must report a disconnect by the peer
// (CMEventDisconnected), and Disconnect must move the QP to ERR.
type Dialer interface {
	Dial(ctx context.Context, qp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error)
}

// CMDialer dials with an RDMA connection manager (transport.ConnManager: librdmacm on the verbs
// engine, the IB CM over QP1 on softroce) to Remote, the target's IP address and RDMA CM port
// (DefaultPort when 0). It needs LoginRDMACM: the 64-byte login request does not fit the 56
// bytes of private data that RDMA CM leaves.
type CMDialer struct {
	CM     transport.ConnManager
	Remote netip.AddrPort
}

// Dial implements Dialer.
func (d *CMDialer) Dial(ctx context.Context, qp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	r := d.Remote
	if r.Port() == 0 {
		r = netip.AddrPortFrom(r.Addr(), DefaultPort)
	}
	return d.CM.Dial(ctx, r, qp, privateData, param)
}
