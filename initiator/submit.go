package initiator

// I/O submission, after ib_srp.c (srp_queuecommand, srp_map_data): a command takes a credit
// and a new tag, maps its data (immediate data, or registrations from the MR pool) and goes out
// as one all-or-nothing post of the REG_MRs and the SRP_CMD's SEND.

import (
	"context"
	"fmt"
	"time"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// start sends the command of spec on r, a slot of c taken from c.free. It returns posted ==
// false when nothing was sent (the slot must go back to c.free; err says why: errChannelDown,
// a context error, or a transient shortage), and posted == true when the command is on its way:
// the caller then waits for r.done.
func (c *channel) start(ctx context.Context, r *request, spec *cmdSpec) (posted bool, err error) {
	return c.startCmd(ctx, r, spec, true)
}

// startCmd is start; without wait it returns errNoCredit instead of waiting for a credit.
func (c *channel) startCmd(ctx context.Context, r *request, spec *cmdSpec, wait bool) (posted bool, err error) {
	if err := c.waitCmdCredit(ctx, wait); err != nil {
		return false, err
	}
	// c.mu and postMu (read) held.
	c.beginLocked(r, spec)
	c.mu.Unlock()
	select { // a token left over from an earlier use (should not happen)
	case <-r.done:
	default:
	}

	r.started = time.Now() // before the post: an asynchronous command is another goroutine's then
	// With a device that can run its own deliveries on the caller (softroce: a target in this
	// process, on the same device), the post is bracketed so that the command, the target's
	// answer and its completion are processed right here (transport.Progresser). Hold only
	// from here on: nothing below blocks, so nothing can wait for this Progress.
	if c.cqp.Hold() {
		defer c.cqp.Progress() // after postMu is released
	}
	sent, err := c.post(r)
	c.postMu.RUnlock()
	if sent {
		return true, nil
	}
	// Nothing reached the send queue (the post is all-or-nothing): undo.
	c.mu.Lock()
	c.reqLim++
	r.state = reqIdle
	c.inflight--
	c.mu.Unlock()
	return false, err
}

// beginLocked spends a credit on r and makes it the in-flight command of spec, under a new tag.
func (c *channel) beginLocked(r *request, spec *cmdSpec) {
	c.reqLim--
	r.gen++
	r.tag = makeTag(false, r.gen, c.idx, r.idx)
	r.state = reqInflight
	r.out = outNone
	r.pending = 0
	r.ungiven = 0
	r.nregs = 0
	r.invQueued = false
	r.signaled = false
	r.imm = false
	r.senseLen = 0
	r.spec = *spec
	c.inflight++
}

// post maps r's data (immediate data, or MRs from the pool) and posts the REG_MRs and the SEND
// in one all-or-nothing chain. sent reports whether it was posted; if not, nothing was (the
// handles went back to the pool). postMu (read) is held.
func (c *channel) post(r *request) (sent bool, err error) {
	sp := &r.spec
	f := &r.cmdf
	*f = srp.CmdFields{Tag: tagBytes(r.tag), LUN: sp.lunAddr, CDB: sp.cdb[:sp.cdbLen]}
	p := &c.params
	r.chain.Reg = nil
	switch {
	case sp.n == 0 || sp.dir == dirNone:
	case sp.dir == dirOut && sp.n <= p.maxImm:
		// SRP-2 immediate data: the data travels in the SRP_CMD itself, no MR.
		f.DataOut = srp.DataBuf{Format: srp.DescImmediate, Total: uint32(sp.n)}
		f.ImmDataOffset = srp.DefaultImmDataOffset
		if !sp.zero {
			f.DataOut.Imm = sp.buf[:sp.n]
		}
		r.imm = true
	default:
		if sp.addr == 0 && sp.dir == dirOut {
			if sp.zero {
				clear(r.data[:sp.n])
			} else {
				copy(r.data, sp.buf[:sp.n])
			}
		}
		k := (sp.n + c.mrBytes - 1) / c.mrBytes
		if k > p.maxDescs || k > len(r.regs) {
			return false, fmt.Errorf("initiator: %d bytes need %d descriptors, the channel allows %d", sp.n, k, p.maxDescs)
		}
		base := r.dAddr
		if sp.addr != 0 {
			base = sp.addr // the caller's Buffer, page-aligned like the slot's buffer
		}
		for j := 0; j < k; j++ {
			off := j * c.mrBytes
			r.segs[0] = frpool.Seg{Addr: base + uint64(off), Len: min(c.mrBytes, sp.n-off)}
			reg, err := c.pool.TryGet(r.segs[:], r)
			if err != nil {
				for i := 0; i < j; i++ {
					_ = c.pool.Cancel(r.regs[i])
					r.regs[i] = nil
				}
				return false, err
			}
			r.regs[j] = reg
		}
		r.chain.Reg = r.regs[:k]
		var d srp.DataBuf
		if k == 1 {
			reg := r.regs[0]
			d = srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: reg.IOVA(), Key: reg.RKey(), Len: uint32(sp.n)}}
		} else {
			list := srp.DescList(r.descs[:k*srp.DirectDescLen])
			for j := 0; j < k; j++ {
				reg := r.regs[j]
				list.Set(j, srp.DirectDesc{VA: reg.IOVA(), Key: reg.RKey(), Len: uint32(reg.Length())})
			}
			// The whole table travels in the IU; its table descriptor names where it sits in our
			// IU buffer (not remotely accessible: a target never needs to fetch a complete table).
			d = srp.DataBuf{Format: srp.DescIndirect, Total: uint32(sp.n), List: list,
				Table: srp.DirectDesc{VA: r.iuAddr + srp.CmdHdrLen + srp.IndirectHdrLen, Len: uint32(len(list))}}
		}
		if sp.dir == dirOut {
			f.DataOut = d
		} else {
			f.DataIn = d
		}
	}
	k := len(r.chain.Reg)
	n, err := srp.Cmd(r.iu).Encode(f)
	if err == nil && f.DataOut.Format == srp.DescImmediate && f.DataOut.Imm == nil {
		clear(r.iu[n : n+sp.n])
		n += sp.n
	}
	if err == nil {
		r.sge[0] = transport.SGE{Addr: r.iuAddr, Length: uint32(n), LKey: c.iuMR.LKey()}
		r.wr[0] = transport.SendWR{ID: cqpoll.WRID(kindCmd, uint32(r.idx)), Opcode: transport.WRSend, SGL: r.sge[:]}
		// The registrations are live from the post on: account for them first.
		c.mu.Lock()
		r.nregs, r.pending, r.ungiven = k, k, k
		r.direct = k > 0 && sp.addr != 0
		for i := 0; i < k; i++ {
			r.rel[i], r.given[i] = false, false
		}
		c.mu.Unlock()
		// REG_MRs and the SEND that names their keys, all or nothing.
		err = c.pool.Post(&r.chain)
	}
	r.chain.Reg = nil
	if err != nil {
		c.mu.Lock()
		r.nregs, r.pending, r.ungiven = 0, 0, 0
		r.direct = false
		c.mu.Unlock()
		for i := 0; i < k; i++ {
			_ = c.pool.Cancel(r.regs[i])
			r.regs[i] = nil
		}
		return false, err
	}
	return true, nil
}
