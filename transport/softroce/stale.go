package softroce

import (
	"net/netip"

	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
)

// ConnIdentity is what a peer's CM needs to recognise one of this device's established
// connections: the local address, the peer's address and UDP port, both communication IDs
// and the peer's QPN. A daemon records the identities of its connections so that after a
// crash its next instance can disconnect them with SendStaleDREQ (the peer learns at once
// instead of through its own timeouts).
type ConnIdentity struct {
	Local        netip.Addr     `json:"local"`
	Remote       netip.AddrPort `json:"remote"`
	LocalCommID  uint32         `json:"local_comm_id"`
	RemoteCommID uint32         `json:"remote_comm_id"`
	RemoteQPN    uint32         `json:"remote_qpn"`
}

// EstablishedConns returns the identities of the device's established RC connections (both
// dialled and accepted), in no particular order (queue 0 of a multi-queue device: those of
// every queue).
func (d *Device) EstablishedConns() []ConnIdentity {
	var ids []ConnIdentity
	for _, q := range d.members() {
		ids = q.establishedConns(ids)
	}
	return ids
}

func (d *Device) establishedConns(ids []ConnIdentity) []ConnIdentity {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, rec := range d.cm.conns {
		ci, ok := d.cm.mgr.Conn(id)
		if !ok || ci.State != cm.StateEstablished {
			continue
		}
		port := rec.udpPort
		if port == 0 {
			port = link.UDPPort
		}
		ids = append(ids, ConnIdentity{
			Local: ci.LocalAddr, Remote: netip.AddrPortFrom(ci.RemoteAddr, port),
			LocalCommID: uint32(ci.ID), RemoteCommID: ci.RemoteCommID, RemoteQPN: ci.RemoteQPN,
		})
	}
	return ids
}

// SendStaleDREQ sends one DREQ for a connection of an earlier instance (cm.Manager.StaleDREQ),
// from id.Local to id.Remote (its UDP port included). The device keeps no state for it: the
// peer's answer is dropped, and a caller that wants to cover a lost DREQ calls again.
func (d *Device) SendStaleDREQ(id ConnIdentity) {
	d.mu.Lock()
	c := d.cm
	var out cm.Outputs
	c.mgr.StaleDREQ(cm.StaleConn{Local: id.Local, Remote: id.Remote.Addr(), LocalCommID: id.LocalCommID,
		RemoteCommID: id.RemoteCommID, RemoteQPN: id.RemoteQPN}, &out)
	for i := range out.MADs {
		c.queueMADTo(&out.MADs[i], id.Remote.Port())
	}
	send := len(c.txq) > 0
	d.mu.Unlock()
	if send {
		d.wake()
	}
}
