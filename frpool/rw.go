package frpool

import (
	"fmt"
	"sort"

	"github.com/srpd/srpd/transport"
)

// This file is the target-side read/write context API, modelled on Linux's rdma_rw_ctx
// (torvalds/linux drivers/infiniband/core/rw.c, read at commit 00da250c21b0):
//
//   - rdma_rw_ctx_init → RWCtx.Init: the local scatter list is split into RDMA READ / WRITE work
//     requests of at most max_sge SGEs each, the remote address advancing by the bytes of each WR
//     (rdma_rw_init_map_wrs: "rdma_wr->remote_addr = remote_addr + total_len", nr_sge =
//     min(sg_cnt, max_sge)). Unlike rdma_rw_ctx, one context covers a whole remote descriptor list
//     (ib_srpt builds one rdma_rw_ctx per direct descriptor and chains them); a WR never crosses a
//     descriptor, nor the peer's per-message limit (Config.PeerMaxMsg).
//   - rdma_rw_ctx_wrs / rdma_rw_ctx_post → Pool.PostRW: the WRs are posted as one chain in which
//     only the last WR is signaled ("last_wr->send_flags |= IB_SEND_SIGNALED"), or, when a
//     chain_wr is given, the chain continues with it (ib_srpt posts the RDMA WRITEs of a data-in
//     command followed by the SRP_RSP SEND, only the SEND signaled).
//   - Local memory uses the PD-wide lkey in Linux (local_dma_lkey); the transport API has none,
//     so memory given to AddLocalMemory is registered once with a regular MR and the context looks
//     the lkey up. The ULP never handles MRs.
//
// RDMA READs are additionally chunked into waves of at most max_rd_atomic WRs (Config.MaxRdAtomic,
// defaulting to the QP's value): a wave's last READ is signaled and its completion, which the pool
// consumes, posts the next wave from slots reserved at PostRW. The ULP sees one completion for the
// whole transfer (RWOwner.RWDone). Most transfers fit in one wave.

// RWDir is the direction of an RW context.
type RWDir uint8

// Directions.
const (
	// RWRead: RDMA READ from the remote descriptors into local memory (target data-out, SCSI
	// WRITE).
	RWRead RWDir = 1
	// RWWrite: RDMA WRITE of local memory to the remote descriptors (target data-in, SCSI READ).
	RWWrite RWDir = 2
)

// RemoteSeg is a remote memory descriptor (an SRP direct descriptor): Len bytes at the peer's
// address Addr, accessible with RKey.
type RemoteSeg struct {
	Addr uint64
	RKey uint32
	Len  uint32
}

// RWOwner is told when a posted RW context has completed: err is nil, or describes the failed
// completion (wrapping ErrQPError). Called once per PostRW, without pool locks held. The context
// may be re-initialised or re-posted from the callback.
type RWOwner interface {
	RWDone(c *RWCtx, err error)
}

type rwState uint8

const (
	rwIdle   rwState = iota // not initialised
	rwReady                 // Init done, not posted (or completed)
	rwPosted                // posted, RWDone pending
)

// RWCtx is a reusable RDMA READ/WRITE context. Create one per outstanding command with
// Pool.NewRWCtx (it preallocates its work requests and SGEs), then Init and PostRW it for each
// transfer; neither allocates.
type RWCtx struct {
	p     *Pool
	gen   uint32
	state rwState
	dir   RWDir
	wrs   []transport.SendWR
	sges  []transport.SGE
	nwr   int
	next  int // first WR not yet posted
	wave  int
	bytes uint64
	owner RWOwner
	err   error
	resv  int // send-queue slots reserved for waves not yet posted

	nextNotify *RWCtx
}

// NewRWCtx returns a context able to hold up to maxWRs work requests using up to maxSGEs local
// SGEs in total.
func (p *Pool) NewRWCtx(maxWRs, maxSGEs int) *RWCtx {
	return &RWCtx{p: p, wrs: make([]transport.SendWR, maxWRs), sges: make([]transport.SGE, maxSGEs)}
}

// WRs is the number of RDMA work requests of the initialised transfer.
func (c *RWCtx) WRs() int { return c.nwr }

// Bytes is the length of the initialised transfer.
func (c *RWCtx) Bytes() uint64 { return c.bytes }

// Init prepares a transfer between local (device addresses; an SGE with LKey 0 takes its lkey
// from memory added with AddLocalMemory; for RWWrite on a device with DeviceAttr.HostSGE, an
// SGE.Host: process memory, split as the others) and remote. The total lengths must be equal. It returns
// the number of RDMA work requests.
func (c *RWCtx) Init(dir RWDir, local []transport.SGE, remote []RemoteSeg) (int, error) {
	if c.state == rwPosted {
		return 0, ErrState
	}
	if dir != RWRead && dir != RWWrite {
		return 0, fmt.Errorf("frpool: RW direction %d: %w", dir, transport.ErrInvalidArgument)
	}
	p := c.p
	lm := *p.local.Load()
	op := transport.WRRDMARead
	if dir == RWWrite {
		op = transport.WRRDMAWrite
	}
	maxSGE, maxLen := p.maxSGE, p.maxWRLen
	nwr, nsge, li := 0, 0, 0
	var loff uint32
	var total uint64
	c.state = rwIdle
	for _, rs := range remote {
		var roff uint32
		for roff < rs.Len {
			if nwr == len(c.wrs) {
				return 0, ErrRWLength
			}
			start, wlen, wAddr := nsge, uint64(0), rs.Addr+uint64(roff)
			for roff < rs.Len && wlen < maxLen && nsge-start < maxSGE {
				for li < len(local) && local[li].Length == loff {
					li, loff = li+1, 0
				}
				if li == len(local) || nsge == len(c.sges) {
					return 0, ErrRWLength
				}
				l := &local[li]
				take := l.Length - loff
				take = min(take, rs.Len-roff)
				if uint64(take) > maxLen-wlen {
					take = uint32(maxLen - wlen)
				}
				if l.Host != nil {
					if dir != RWWrite {
						return 0, fmt.Errorf("frpool: SGE.Host as an RDMA READ destination: %w", transport.ErrInvalidArgument)
					}
					c.sges[nsge] = transport.SGE{Host: l.Host[loff : loff+take : loff+take], Length: take}
				} else {
					addr := l.Addr + uint64(loff)
					lkey := l.LKey
					if lkey == 0 {
						var ok bool
						if lkey, ok = lookupLocal(lm, addr, uint64(take)); !ok {
							return 0, ErrNotRegistered
						}
					}
					c.sges[nsge] = transport.SGE{Addr: addr, Length: take, LKey: lkey}
				}
				nsge++
				wlen += uint64(take)
				roff += take
				loff += take
			}
			c.wrs[nwr] = transport.SendWR{Opcode: op, SGL: c.sges[start:nsge:nsge], RemoteAddr: wAddr, RKey: rs.RKey}
			nwr++
			total += wlen
		}
	}
	for li < len(local) && local[li].Length == loff {
		li, loff = li+1, 0
	}
	if li != len(local) || nwr == 0 {
		return 0, ErrRWLength
	}
	c.dir, c.nwr, c.bytes, c.state = dir, nwr, total, rwReady
	return nwr, nil
}

func lookupLocal(lm []localMem, addr, n uint64) (uint32, bool) {
	i := sort.Search(len(lm), func(i int) bool { return lm[i].addr > addr }) - 1
	if i < 0 || addr+n > lm[i].end || addr+n < addr {
		return 0, false
	}
	return lm[i].lkey, true
}

// AddLocalMemory registers m for local access (a regular MR with LocalWrite) so that RW contexts
// can use it without the ULP handling lkeys. The MR lives until Close.
func (p *Pool) AddLocalMemory(m transport.Memory) error {
	mr, err := p.pd.RegMR(m.Addr(), uint64(m.Len()), transport.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("frpool: registering local memory: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = mr.Close()
		return ErrClosed
	}
	old := *p.local.Load()
	lm := make([]localMem, 0, len(old)+1)
	lm = append(lm, old...)
	lm = append(lm, localMem{addr: m.Addr(), end: m.Addr() + uint64(m.Len()), lkey: mr.LKey(), mr: mr})
	sort.Slice(lm, func(i, j int) bool { return lm[i].addr < lm[j].addr })
	p.local.Store(&lm)
	return nil
}

// rdAtomicLocked is the READ wave size.
func (p *Pool) rdAtomicLocked() int {
	if p.cfgRdAtom > 0 {
		return p.cfgRdAtom
	}
	if p.rdAtomic == 0 {
		p.rdAtomic = max(1, int(p.qp.Query().MaxRdAtomic))
	}
	return p.rdAtomic
}

// PostRW posts an initialised context; owner.RWDone is called once when the whole transfer has
// completed (or failed). For RWWrite, resp (typically the SRP_RSP SEND) may be given: it is
// posted in the same all-or-nothing chain right after the RDMA WRITEs and its completion is the
// transfer's completion (as ib_srpt posts data-in); the ULP also gets resp's completion from
// HandleSendCompletion if it set SendSignaled on it. Send-queue slots for the whole transfer are
// reserved at once; ErrSQFull if they are not available (nothing posted).
func (p *Pool) PostRW(c *RWCtx, resp *transport.SendWR, owner RWOwner) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if c.p != p || c.state != rwReady {
		return ErrState
	}
	if resp != nil && c.dir != RWWrite {
		return fmt.Errorf("frpool: a response can only be chained to RDMA WRITEs: %w", ErrState)
	}
	total := c.nwr
	if resp != nil {
		total++
	}
	if total > p.t.free()-1-p.reserved {
		return ErrSQFull
	}
	c.wave = c.nwr
	if c.dir == RWRead {
		c.wave = p.rdAtomicLocked()
	}
	to := min(c.wave, c.nwr)
	n := p.buildWaveLocked(c, 0, to, resp)
	if err := p.postLocked(n); err != nil {
		return err
	}
	c.state = rwPosted
	c.owner = owner
	c.err = nil
	c.next = to
	c.resv = c.nwr - to
	p.reserved += c.resv
	return nil
}

// buildWaveLocked fills p.wrs / p.ents with WRs [from, to) of c (plus resp) and returns the count.
func (p *Pool) buildWaveLocked(c *RWCtx, from, to int, resp *transport.SendWR) int {
	n := 0
	for i := from; i < to; i++ {
		p.wrs[n] = c.wrs[i]
		p.wrs[n].ID = WRIDTag | p.t.seqAt(n)&seqMask
		p.wrs[n].Flags = 0
		p.ents[n] = sqEntry{kind: kindRW, rw: c, gen: c.gen, op: c.wrs[i].Opcode}
		n++
	}
	if resp != nil {
		p.wrs[n] = *resp
		p.wrs[n].ID = WRIDTag | p.t.seqAt(n)&seqMask
		p.ents[n] = sqEntry{kind: kindRW, rw: c, gen: c.gen, op: resp.Opcode, ulp: true, ulpID: resp.ID,
			ulpWants: resp.Flags&transport.SendSignaled != 0}
		n++
	}
	p.signalLocked(n - 1)
	p.ents[n-1].waveEnd = true
	return n
}

// waveDoneLocked runs when the last WR of a wave of c is retired: post the next wave, or finish.
func (p *Pool) waveDoneLocked(c *RWCtx) {
	if c.err == nil && c.next < c.nwr && p.qpErr != nil {
		// Waves are left but the QP went to error (through another WR) while this wave
		// succeeded: the transfer is incomplete and must not be reported as done.
		c.err = p.qpErr // wraps ErrQPError
	}
	if c.err == nil && c.next < c.nwr {
		to := min(c.next+c.wave, c.nwr)
		n := p.buildWaveLocked(c, c.next, to, nil)
		// The slots were reserved at PostRW: every other post leaves reserved+1 slots free.
		p.reserved -= n
		c.resv -= n
		err := p.postLocked(n)
		if err == nil {
			c.next = to
			return
		}
		c.err = err
	}
	p.reserved -= c.resv
	c.resv = 0
	c.next = c.nwr
	c.gen++ // later completions of this transfer (flushes) are not its business any more
	p.c.rw++
	c.nextNotify = p.notifyRW
	p.notifyRW = c
}
