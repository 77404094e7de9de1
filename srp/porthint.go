package srp

import "bytes"

// Target port hint: an srpd extension carried after an SRP_LOGIN_REJ.
//
// Over the RDMA CM an initiator must name the target port identifier in its SRP_LOGIN_REQ
// before it can learn anything from the target; InfiniBand initiators get it from the device
// management agent's IOC profile (srp_daemon), which RoCE does not have. An srpd target that
// rejects a login for naming the wrong target port identifier (REASON 0x00010004, unable to
// associate the channel) appends its own identifier to the SRP_LOGIN_REJ, in the rest of the
// CM REJ private data (148 bytes: torvalds/linux:include/rdma/ib_cm.h
// IB_CM_REJ_PRIVATE_DATA_SIZE), which SRP leaves unused: ib_srp's srp_cm_rej_handler reads the
// opcode and REASON only. `srpctl discover` logs in with a probe identifier to get it. The
// hint names nothing a login does not also need; the target's ACLs still decide every login.
//
//	bytes 0-31  SRP_LOGIN_REJ
//	      32-35 "SRPD"
//	      36    version (1)
//	      37-39 reserved (0)
//	      40-55 the target port identifier
const (
	PortHintOffset = LoginRejLen
	PortHintLen    = 24
	portHintVer    = 1
)

var portHintMagic = []byte("SRPD")

// AppendPortHint writes the hint for id after the SRP_LOGIN_REJ in rej (which must hold
// LoginRejLen + PortHintLen bytes) and returns the length of the whole.
func AppendPortHint(rej []byte, id PortID) int {
	h := rej[PortHintOffset : PortHintOffset+PortHintLen]
	clear(h)
	copy(h, portHintMagic)
	h[4] = portHintVer
	copy(h[8:], id[:])
	return PortHintOffset + PortHintLen
}

// ParsePortHint returns the target port identifier an srpd target appended to the
// SRP_LOGIN_REJ in pd (CM REJ private data), if pd holds one: an SRP_LOGIN_REJ, then the magic
// and a version this package reads. Anything else (a kernel target's REJ, zero padding,
// garbage) yields ok false.
func ParsePortHint(pd []byte) (id PortID, ok bool) {
	if len(pd) < PortHintOffset+PortHintLen {
		return id, false
	}
	if _, err := ParseLoginRej(pd); err != nil {
		return id, false
	}
	h := pd[PortHintOffset : PortHintOffset+PortHintLen]
	if !bytes.Equal(h[:4], portHintMagic) || h[4] != portHintVer {
		return id, false
	}
	copy(id[:], h[8:24])
	return id, true
}
