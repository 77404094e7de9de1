package link

import "github.com/srpd/srpd/transport/softroce/wire"

// QueueOf is the receive queue, of n, that owns destination QP qpn on a multi-queue device:
// QP1 (the GSI QP, connection management) is always queue 0, any other QP is qpn mod n. A
// multi-queue device allocates each queue's QP numbers in its residue class, so that the
// kernel can steer an RC packet to its QP's queue from the BTH alone (ListenUDPQueues), as a
// NIC's RSS does from the UDP source port that rxe derives from the QPN.
func QueueOf(qpn uint32, n int) int {
	if n <= 1 || qpn == wire.QPGSI {
		return 0
	}
	return int(qpn % uint32(n))
}
