//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
)

// rxeVendorID is rdma_rxe's vendor ID (RXE_VENDOR_ID).
const rxeVendorID = 0xFFFFFF

// Built reports whether this binary contains the verbs engine (build tag `verbs`).
const Built = true

// DeviceNames lists the RDMA devices libibverbs sees.
func DeviceNames() ([]string, error) {
	names, err := deviceNames()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return names, nil
}

var (
	_ transport.Device      = (*Device)(nil)
	_ transport.ConnManager = (*Device)(nil)
)

// Device implements transport.Device (and transport.ConnManager) on one port of an RDMA device.
type Device struct {
	name    string
	cfg     Config
	log     *zap.Logger
	port    int
	ctx     *C.struct_ibv_context
	list    **C.struct_ibv_context
	attr    transport.DeviceAttr
	mwType2 bool
	// invMask is the wc_flags bit(s) meaning "with invalidate" (see shim_poll).
	invMask uint32

	gen atomic.Uint32 // QP generations (high bits of wire WR IDs)

	mu     sync.Mutex // resource registry below
	closed bool
	mems   []*region // sorted by base
	pds    map[*pd]struct{}
	cqs    map[*cq]struct{}
	mws    map[uint32]*fastMR // by index (rkey >> 8)

	qpMu sync.RWMutex
	qps  map[uint32]*qp

	asyncStop int // eventfd
	asyncDone chan struct{}

	cmOnce sync.Once
	cm     *cmState
	cmErr  error
}

// OpenDevice opens port cfg.Port of the RDMA device name (as ibv_devices lists it).
func OpenDevice(name string, cfg Config) (transport.Device, error) {
	d, err := Open(name, cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Open is OpenDevice returning the concrete type.
func Open(name string, cfg Config) (*Device, error) {
	cfg.fill()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var list **C.struct_ibv_context
	ctx, err := C.shim_open(cname, &list)
	if ctx == nil {
		return nil, fmt.Errorf("%w: open %q: %v", ErrUnavailable, name, err)
	}
	d := &Device{
		name: name, cfg: cfg, log: cfg.Logger.With(zap.String("dev", name)), port: cfg.Port,
		ctx: ctx, list: list,
		pds: make(map[*pd]struct{}), cqs: make(map[*cq]struct{}), mws: make(map[uint32]*fastMR),
		qps: make(map[uint32]*qp),
	}
	fail := func(err error) (*Device, error) {
		C.rdma_free_devices(list)
		return nil, err
	}
	var a C.struct_shim_devattr
	if r := C.shim_query(ctx, C.int(d.port), &a); r != 0 {
		return fail(posErrno(fmt.Sprintf("query %s port %d", name, d.port), r))
	}
	if a.link_layer != C.IBV_LINK_LAYER_ETHERNET {
		return fail(fmt.Errorf("verbs: %s port %d: link layer %d is not Ethernet (only RoCE): %w", name, d.port, a.link_layer, transport.ErrNotSupported))
	}
	caps := uint64(a.device_cap_flags)
	d.mwType2 = caps&(C.IBV_DEVICE_MEM_WINDOW_TYPE_2A|C.IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0
	d.attr = transport.DeviceAttr{
		PageSize:        unix.Getpagesize(),
		PageSizeCap:     uint64(a.page_size_cap),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxMRPages:      cfg.MaxMRPages,
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MaxMsgSize:      uint64(a.max_msg_sz),
		MaxMTU:          transport.MTU(a.max_mtu),
		ActiveMTU:       transport.MTU(a.active_mtu),
		AtomicCap:       false, // atomics are not expressible in transport.SendWR
		VendorID:        uint32(a.vendor_id),
	}
	if d.attr.PageSizeCap == 0 {
		d.attr.PageSizeCap = uint64(d.attr.PageSize)
	}
	if !d.mwType2 {
		d.attr.MaxMRPages = 0
	}
	d.attr.MaxInlineData = d.probeInline()
	d.invMask = uint32(C.IBV_WC_WITH_INV)
	if a.vendor_id == rxeVendorID {
		d.invMask |= 1 << 2 // rxe: kernel IB_WC_WITH_INVALIDATE in user CQEs
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fail(fmt.Errorf("verbs: eventfd: %w", err))
	}
	d.asyncStop, d.asyncDone = efd, make(chan struct{})
	go d.asyncLoop()
	d.log.Debug("opened", zap.Any("attr", d.attr), zap.Bool("mw_type2", d.mwType2))
	return d, nil
}

// probeInline finds the largest inline size (of 512, 256, 128, 64, 0) an RC QP accepts.
func (d *Device) probeInline() int {
	p := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return 0
	}
	defer C.ibv_dealloc_pd(p)
	var ch *C.struct_ibv_comp_channel
	c := C.shim_create_cq(d.ctx, 4, &ch)
	if c == nil {
		return 0
	}
	defer C.shim_destroy_cq(c, ch)
	for _, n := range []int{512, 256, 128, 64} {
		caps := C.struct_shim_caps{send_wr: 1, recv_wr: 1, send_sge: 1, recv_sge: 1, inline_data: C.uint32_t(n)}
		q := C.shim_create_qp(p, c, c, &caps, 0)
		if q != nil {
			C.ibv_destroy_qp(q)
			return int(caps.inline_data)
		}
	}
	return 0
}

// Name implements transport.Device.
func (d *Device) Name() string { return d.name }

// Attr implements transport.Device.
func (d *Device) Attr() transport.DeviceAttr { return d.attr }

// gidTable reads the port's GID table: RoCEv2 entries, others zero.
func (d *Device) gidTable() []transport.GID {
	var a C.struct_shim_devattr
	if C.shim_query(d.ctx, C.int(d.port), &a) != 0 {
		return nil
	}
	n := int(a.gid_tbl_len)
	gids := make([]transport.GID, n)
	last := -1
	for i := 0; i < n; i++ {
		var raw [16]C.uint8_t
		var typ C.int
		if C.shim_query_gid(d.ctx, C.int(d.port), C.int(i), &raw[0], &typ) != 0 || typ != C.IBV_GID_TYPE_ROCE_V2 {
			continue
		}
		for k := range raw {
			gids[i][k] = byte(raw[k])
		}
		if gids[i] != (transport.GID{}) {
			last = i
		}
	}
	return gids[:last+1]
}

// GIDs implements transport.Device: the port's RoCEv2 GIDs by index (other entries zero).
func (d *Device) GIDs() []transport.GID { return d.gidTable() }

// Addrs implements transport.Device: the IP of every RoCEv2 GID at UDP 4791.
func (d *Device) Addrs() []netip.AddrPort {
	var out []netip.AddrPort
	for _, g := range d.gidTable() {
		if g == (transport.GID{}) {
			continue
		}
		out = append(out, netip.AddrPortFrom(g.Addr(), transport.RoCEv2Port))
	}
	return out
}

// sgidIndex is the GID index of a RoCEv2 GID for addr, or -1.
func (d *Device) sgidIndex(addr netip.Addr) int {
	want := transport.GIDFromAddr(addr.Unmap())
	for i, g := range d.gidTable() {
		if g == want {
			return i
		}
	}
	return -1
}

func (d *Device) isLocal(addr netip.Addr) bool { return d.sgidIndex(addr) >= 0 }

// AllocMemory implements transport.Device: anonymous, page-aligned, zeroed memory whose device
// address is its virtual address.
func (d *Device) AllocMemory(n int) (transport.Memory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("verbs: allocate %d bytes: %w", n, transport.ErrInvalidArgument)
	}
	ps := d.attr.PageSize
	n = (n + ps - 1) / ps * ps
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w: %w", n, transport.ErrNoResources, err)
	}
	r := &region{dev: d, buf: buf, base: uint64(uintptr(unsafe.Pointer(&buf[0]))), backing: make(map[*pd]*C.struct_ibv_mr)}
	i := sort.Search(len(d.mems), func(i int) bool { return d.mems[i].base > r.base })
	d.mems = append(d.mems, nil)
	copy(d.mems[i+1:], d.mems[i:])
	d.mems[i] = r
	return memory{r}, nil
}

// findRegion returns the region containing [addr, addr+n) entirely, or nil. d.mu held.
func (d *Device) findRegion(addr, n uint64) *region {
	i := sort.Search(len(d.mems), func(i int) bool { return d.mems[i].base > addr })
	if i == 0 {
		return nil
	}
	r := d.mems[i-1]
	off := addr - r.base
	if off >= uint64(len(r.buf)) || n > uint64(len(r.buf))-off {
		return nil
	}
	return r
}

// AllocPD implements transport.Device.
func (d *Device) AllocPD() (transport.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	p, err := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, errnoErr("ibv_alloc_pd", err))
	}
	x := &pd{dev: d, ib: p}
	d.pds[x] = struct{}{}
	return x, nil
}

// Close implements transport.Device: every QP goes to ERR, the engine waits (bounded by ctx)
// for their flushes to be polled, then destroys connection IDs, QPs, windows, MRs, CQs and PDs
// and releases the device context. Memory stays mapped until freed.
func (d *Device) Close(ctx context.Context) error {
	if !claimTeardown(&d.mu, &d.closed) {
		return transport.ErrClosed
	}

	if d.cm != nil {
		d.cm.close()
	}
	d.qpMu.RLock()
	qps := slices.Collect(maps.Values(d.qps))
	d.qpMu.RUnlock()
	for _, q := range qps {
		q.toErr()
	}
	var err error
	for _, q := range qps {
		if e := q.drain(ctx); e != nil && err == nil {
			err = e
		}
	}
	// Windows first: a bound type-2 window holds a reference on its QP, and rxe complains
	// (and waits) when such a QP is destroyed.
	d.mu.Lock()
	mws := slices.Collect(maps.Values(d.mws))
	d.mu.Unlock()
	for _, m := range mws {
		m.destroy()
	}
	for _, q := range qps {
		q.destroy()
	}
	d.mu.Lock()
	for _, r := range d.mems {
		r.dropBacking(nil)
		r.users = 0
	}
	pds := slices.Collect(maps.Keys(d.pds))
	cqs := slices.Collect(maps.Keys(d.cqs))
	d.mu.Unlock()
	for _, p := range pds {
		p.destroyMRs()
	}
	for _, c := range cqs {
		c.destroy()
	}
	for _, p := range pds {
		p.destroy()
	}
	wake(d.asyncStop)
	<-d.asyncDone
	unix.Close(d.asyncStop)
	C.rdma_free_devices(d.list)
	return err
}

// wake writes to an eventfd.
func wake(fd int) {
	var one = [8]byte{1}
	_, _ = unix.Write(fd, one[:])
}

// asyncLoop reads the device's async events: QP errors move the engine's view of the QP to ERR;
// COMM_EST on a QP whose Accept waits for the RTU is passed on to rdma_cm (rdma_notify).
func (d *Device) asyncLoop() {
	defer close(d.asyncDone)
	for {
		var typ C.int
		var qpn C.int64_t
		r := C.shim_async_get(d.ctx, C.int(d.asyncStop), &typ, &qpn)
		if r == 0 {
			return
		}
		if r < 0 {
			if syscall.Errno(-r) == syscall.EINTR || syscall.Errno(-r) == syscall.EAGAIN {
				continue
			}
			d.log.Warn("async event channel failed", zap.Error(syscall.Errno(-r)))
			return
		}
		var q *qp
		if qpn >= 0 {
			d.qpMu.RLock()
			q = d.qps[uint32(qpn)]
			d.qpMu.RUnlock()
		}
		switch typ {
		case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
			if q != nil {
				q.mu.Lock()
				if q.state != transport.QPSReset {
					q.state = transport.QPSErr
				}
				q.mu.Unlock()
			}
			d.log.Debug("QP async error", zap.Int("event", int(typ)), zap.Int64("qpn", int64(qpn)))
		case C.IBV_EVENT_COMM_EST:
			if q != nil {
				q.mu.Lock()
				c := q.pendingAccept
				q.mu.Unlock()
				if c != nil {
					c.notifyEstablished()
				}
			}
		case C.IBV_EVENT_CQ_ERR, C.IBV_EVENT_DEVICE_FATAL:
			d.log.Error("device async error", zap.Int("event", int(typ)))
		}
	}
}
