//go:build verbs && linux && cgo

package verbs

import (
	"testing"

	"github.com/srpd/srpd/transport"
)

// TestIBVOpcode pins the posted opcodes to enum ibv_wr_opcode (linux-rdma/rdma-core:
// libibverbs/verbs.h): REG_MR goes out as BIND_MW (type-2 windows), atomics are not posted.
// It needs no device.
func TestIBVOpcode(t *testing.T) {
	want := map[transport.WROpcode]uint32{
		transport.WRRDMAWrite: 0, transport.WRRDMAWriteWithImm: 1, transport.WRSend: 2, transport.WRSendWithImm: 3,
		transport.WRRDMARead: 4, transport.WRLocalInv: 7, transport.WRRegMR: 8, transport.WRSendWithInv: 9,
	}
	for op := transport.WROpcode(0); op < 255; op++ {
		got, ok := ibvOpcode(op)
		w, posted := want[op]
		if ok != posted || uint32(got) != w {
			t.Errorf("%v: ibvOpcode = %d, %v; want %d, %v", op, got, ok, w, posted)
		}
	}
}
