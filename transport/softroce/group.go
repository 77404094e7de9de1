package softroce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
)

// Multi-queue devices, as a NIC has receive queues (RSS) and completion vectors.
//
// A device opened with Config.Queues is a group of devices, one per queue, each with its own
// link (a UDP socket of link.ListenUDPQueues: all bound to one address and port, the kernel
// steering every packet to the socket of its destination QP), its own goroutines, its own
// mutex and its own QPs, MRs, CQs and CM; they share the device memory (memSpace), so any
// queue may register any of it. Nothing is shared on the packet path, so two queues process
// packets on two CPUs at once — where one device takes one mutex for every QP.
//
// Placement. Queue k numbers its QPs in the residue class k mod n (link.QueueOf), which is
// how the kernel finds a packet's queue from the BTH alone, and its CM's comm IDs likewise
// (cm.Config.CommIDMod), which is how a CM MAD that names one of our connections finds the
// queue that owns it. QP1's packets all reach queue 0, which hands each MAD to its queue
// (cm.Steer): a REQ to the queue of the requester's QPN, so that between two srpd devices
// with as many queues both ends of a connection use the same queue index and the packets of
// one queue pair of sockets never mix another queue's. A packet that reaches another queue
// than its QP's all the same (a GRO super-packet is steered by its first segment) is copied
// to its queue's receive path (Stats.Forwarded).
//
// Use. The device Open returns is queue 0 and stands for the group where a caller sees one
// device: Listen listens on every queue (a request arrives on its queue, whose device is in
// ConnRequestInfo.Device: its QP must be created there), Dial dials from the queue of the QP,
// Stats and CMStats add up the queues, ConfigureCM and SetPeerUDPPort apply to all, Close
// closes all. Queues lists the queues as devices: a ULP puts each channel's PD, CQs, QP (and
// MRs) on one of them, round robin. A ULP that does not, gets queue 0 for everything: correct,
// one queue's speed. Kernel peers see nothing of it: they send every QP's packets to port
// 4791 and get answers from it.

// group is a multi-queue device's shared state. devs is set before any queue starts and
// does not change.
type group struct {
	devs []*Device
	ms   *memSpace
	guid uint64 // the CA GUID every queue's CM uses
}

// openGroup opens the queues of a multi-queue device (Open with Config.Queues).
func openGroup(cfg Config) (*Device, error) {
	links := append([]link.Link{cfg.Link}, cfg.Queues...)
	if len(links) > link.MaxQueues {
		return nil, fmt.Errorf("softroce: %d queues (at most %d): %w", len(links), link.MaxQueues, transport.ErrInvalidArgument)
	}
	for _, l := range links {
		if l == nil {
			return nil, fmt.Errorf("softroce: no link: %w", transport.ErrInvalidArgument)
		}
	}
	g := &group{devs: make([]*Device, len(links)), ms: &memSpace{}, guid: randomGUID()}
	name := cfg.Name
	if name == "" {
		name = defaultName
	}
	for i, l := range links {
		c := cfg
		c.Link, c.Queues = l, nil
		c.Name = name
		if i > 0 {
			c.Name = fmt.Sprintf("%s.q%d", name, i)
		}
		d, err := newDevice(c, g, i)
		if err != nil {
			return nil, err // nothing started; the caller closes its links
		}
		g.devs[i] = d
	}
	g.ms.devs, g.ms.shared = g.devs, true
	for _, d := range g.devs {
		d.start()
	}
	return g.devs[0], nil
}

// Queues implements transport.Queuer: the device's queues, itself first (one for a device
// without Config.Queues).
func (d *Device) Queues() []transport.Device {
	if d.grp == nil {
		return []transport.Device{d}
	}
	out := make([]transport.Device, len(d.grp.devs))
	for i, q := range d.grp.devs {
		out[i] = q
	}
	return out
}

// leads reports whether d stands for a group (queue 0 of a multi-queue device).
func (d *Device) leads() bool { return d.grp != nil && d.qidx == 0 }

// members are the devices a call on d covers: every queue when d stands for a group, else d.
func (d *Device) members() []*Device {
	if d.leads() {
		return d.grp.devs
	}
	return []*Device{d}
}

// madQueue is the queue that handles a MAD received on QP1 (see the package note above).
func (d *Device) madQueue(mad []byte) int {
	key, byQPN, ok := cm.Steer(mad)
	switch {
	case !ok:
		return 0
	case byQPN:
		return link.QueueOf(key, d.nq)
	}
	return int(key % uint32(d.nq))
}

// forward hands a packet this queue received to queue to's receive path, as a copy (the
// packet's buffer is the link's). Called under d.mu; takes only the other queue's loopback
// queue lock.
func (d *Device) forward(to int, pk *link.Packet) {
	d.stats.forwarded.Add(1)
	d.grp.devs[to].inject(pk)
}

// inject queues a copy of pk, received by another queue of the group, for this device's
// receive path: the loopback queue, which any queue drains whether or not it loops back.
func (d *Device) inject(pk *link.Packet) {
	l := &d.loop
	l.mu.Lock()
	buf := l.freeBuf()
	if buf == nil {
		l.mu.Unlock()
		d.stats.loopDrops.Add(1) // the RC retry recovers it, as after a loss on a network
		return
	}
	n := copy(buf, pk.Buf)
	l.q = append(l.q, loopPacket{pk: link.Packet{Src: pk.Src, Dst: pk.Dst, TrafficClass: pk.TrafficClass, Buf: buf[:n]}})
	wake := l.claim()
	l.mu.Unlock()
	if wake {
		l.wake()
	}
}

// closeGroup closes every queue of d's group, at once (each drains within ctx).
func (d *Device) closeGroup(ctx context.Context) error {
	errs := make([]error, len(d.grp.devs))
	var wg sync.WaitGroup
	for i, q := range d.grp.devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = q.closeQueue(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// groupStats adds up the counters of the group's queues.
func (d *Device) groupStats() Stats {
	var sum Stats
	for _, q := range d.members() {
		addStats(&sum, q.queueStats())
	}
	return sum
}

// addStats adds every counter of o to s (uint64 fields and arrays of them).
func addStats(s *Stats, o Stats) {
	sv, ov := reflect.ValueOf(s).Elem(), reflect.ValueOf(o)
	for i := 0; i < sv.NumField(); i++ {
		f, g := sv.Field(i), ov.Field(i)
		switch f.Kind() {
		case reflect.Uint64:
			f.SetUint(f.Uint() + g.Uint())
		case reflect.Array:
			for j := 0; j < f.Len(); j++ {
				f.Index(j).SetUint(f.Index(j).Uint() + g.Index(j).Uint())
			}
		}
	}
}

// QueueStats returns the counters of each queue (one entry for a device of one queue, or for
// a queue other than 0).
func (d *Device) QueueStats() []Stats {
	qs := d.members()
	out := make([]Stats, len(qs))
	for i, q := range qs {
		out[i] = q.queueStats()
	}
	return out
}

// groupListen listens on every queue of the group: one listener, registered with each
// queue's CM, whose requests all come out of one Accept.
func (d *Device) groupListen(addr netip.Addr, port uint16) (transport.Listener, error) {
	l := &listener{dev: d, addr: addr, port: port, ch: make(chan *connRequest, ListenBacklog),
		done: make(chan struct{})}
	for i, q := range d.grp.devs {
		if err := q.register(l); err != nil {
			for _, r := range d.grp.devs[:i] {
				r.unregister(l)
			}
			return nil, err
		}
		l.devs = append(l.devs, q)
	}
	return l, nil
}

// groupDial dials from the queue that holds the QP.
func (d *Device) groupDial(ctx context.Context, remote netip.AddrPort, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	if q, ok := tqp.(*qp); ok && q != nil && q.dev.grp == d.grp {
		d = q.dev
	}
	return d.dial(ctx, remote, tqp, privateData, param) // a QP of no queue: d's cmQP refuses it
}
