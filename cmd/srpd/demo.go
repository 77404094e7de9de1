package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// The demo runs the whole data path of one SRP I/O on the embedded default transport, until the
// target/ and initiator/ packages take over: two softroce devices on UDP loopback, a RAM-backed
// LUN behind the "target" QP, and an "initiator" QP that sends SRP_CMD IUs whose data the target
// moves by RDMA READ (writes) and RDMA WRITE (reads), answering with SRP_RSP. Every byte read
// back is compared with what was written.

type demoConfig struct {
	addr    netip.Addr
	lunSize int64
	ios     int
	maxIO   int
	mtu     transport.MTU
}

// demoEnd is one side: a device, its memory, one RC QP.
type demoEnd struct {
	dev      *softroce.Device
	mem      transport.Memory
	mr       transport.MR
	qp       transport.QP
	scq, rcq transport.CQ
	psn      uint32
}

const (
	iuSize  = 512 // SRP_CMD / SRP_RSP buffers (no immediate data in the demo)
	nRecv   = 4
	recvOff = 0 // receive IU slots at the start of memory
	sendOff = nRecv * iuSize
	dataOff = 64 << 10 // data buffer after the IU area
)

func openEnd(ctx context.Context, addr netip.Addr, memSize int) (*demoEnd, error) {
	lnk, err := link.ListenUDP(ctx, netip.AddrPortFrom(addr, 0), link.UDPOptions{})
	if err != nil {
		return nil, err
	}
	dev, err := softroce.Open(softroce.Config{Link: lnk})
	if err != nil {
		lnk.Close()
		return nil, err
	}
	e := &demoEnd{dev: dev, psn: rand.Uint32N(1 << 24)}
	pd, err := dev.AllocPD()
	if err != nil {
		return e, err
	}
	if e.scq, err = dev.CreateCQ(64); err != nil {
		return e, err
	}
	if e.rcq, err = dev.CreateCQ(64); err != nil {
		return e, err
	}
	if e.mem, err = dev.AllocMemory(memSize); err != nil {
		return e, err
	}
	acc := transport.AccessLocalWrite | transport.AccessRemoteRead | transport.AccessRemoteWrite
	if e.mr, err = pd.RegMR(e.mem.Addr(), uint64(e.mem.Len()), acc); err != nil {
		return e, err
	}
	e.qp, err = pd.CreateQP(transport.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: transport.QPCap{MaxSendWR: 16, MaxRecvWR: nRecv, MaxSendSGE: 1, MaxRecvSGE: 1}})
	return e, err
}

// connectTo brings e's QP to RTS towards peer, exchanging QPN and PSN out of band as
// ibv_rc_pingpong does (connection management over QP1 is the transport's next step).
func (e *demoEnd) connectTo(peer *demoEnd, mtu transport.MTU) error {
	local, remote := e.dev.Addrs()[0], peer.dev.Addrs()[0]
	if err := e.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1,
		AccessFlags: transport.AccessRemoteRead | transport.AccessRemoteWrite},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		return err
	}
	if err := e.qp.Modify(&transport.QPAttr{State: transport.QPSRTR, PathMTU: mtu, DestQPN: peer.qp.QPN(),
		RQPSN: peer.psn, MaxDestRdAtomic: 4, MinRNRTimer: 1,
		AV: transport.AddressVector{SrcAddr: local.Addr(), DstAddr: remote.Addr(), DstPort: remote.Port()}},
		transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
			transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer); err != nil {
		return err
	}
	return e.qp.Modify(&transport.QPAttr{State: transport.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		SQPSN: e.psn, MaxRdAtomic: 4},
		transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|
			transport.AttrSQPSN|transport.AttrMaxQPRdAtomic)
}

func (e *demoEnd) sge(off, n int) transport.SGE {
	return transport.SGE{Addr: e.mem.Addr() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}
}

func (e *demoEnd) postRecv(slot int) error {
	return e.qp.PostRecv([]transport.RecvWR{{ID: uint64(slot), SGL: []transport.SGE{e.sge(recvOff+slot*iuSize, iuSize)}}})
}

func (e *demoEnd) close() {
	if e == nil || e.dev == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.dev.Close(ctx)
	if e.mem != nil {
		e.mem.Free()
	}
}

// wait returns the next completion of cq, failing on error status.
func wait(ctx context.Context, cq transport.CQ) (transport.WC, error) {
	var wc [1]transport.WC
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			return transport.WC{}, err
		}
	}
	if wc[0].Status != transport.WCSuccess {
		return wc[0], fmt.Errorf("completion of %v (wr %d): %v", wc[0].Opcode, wc[0].ID, wc[0].Status)
	}
	return wc[0], nil
}

// post posts one signaled WR and waits for its completion.
func (e *demoEnd) post(ctx context.Context, wr transport.SendWR) error {
	wr.Flags |= transport.SendSignaled
	if err := e.qp.PostSend([]transport.SendWR{wr}); err != nil {
		return err
	}
	_, err := wait(ctx, e.scq)
	return err
}

// serveOne is the target side of one command: receive the SRP_CMD, move the data with RDMA,
// execute it on the LUN, send the SRP_RSP.
func serveOne(ctx context.Context, t *demoEnd, lun *scsi.LUN, nexus scsi.Nexus) error {
	wc, err := wait(ctx, t.rcq)
	if err != nil {
		return err
	}
	slot := int(wc.ID)
	iu := t.mem.Bytes()[recvOff+slot*iuSize : recvOff+slot*iuSize+int(wc.ByteLen)]
	cmd, err := srp.ParseCmd(iu, 0)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	info, err := lun.ParseCDB(cmd.CDB())
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	data := t.mem.Bytes()[dataOff : dataOff+int(info.Length)]
	sc := scsi.Command{CDB: cmd.CDB(), Nexus: nexus}
	var sense [scsi.MaxSenseLen]byte
	sc.Sense = sense[:]
	switch info.Dir {
	case scsi.DirOut:
		d := cmd.DataOut().Direct
		if err := t.post(ctx, transport.SendWR{Opcode: transport.WRRDMARead, SGL: []transport.SGE{t.sge(dataOff, int(info.Length))},
			RemoteAddr: d.VA, RKey: d.Key}); err != nil {
			return fmt.Errorf("target: RDMA READ: %w", err)
		}
		sc.DataOut = data
	case scsi.DirIn:
		sc.DataIn = data
	}
	res := lun.Execute(ctx, &sc)
	if info.Dir == scsi.DirIn && res.DataInLen > 0 {
		d := cmd.DataIn().Direct
		if err := t.post(ctx, transport.SendWR{Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{t.sge(dataOff, res.DataInLen)},
			RemoteAddr: d.VA, RKey: d.Key}); err != nil {
			return fmt.Errorf("target: RDMA WRITE: %w", err)
		}
	}
	if err := t.postRecv(slot); err != nil {
		return err
	}
	rsp := t.mem.Bytes()[sendOff : sendOff+iuSize]
	n, err := srp.Rsp(rsp).Encode(&srp.RspFields{ReqLimDelta: 1, Tag: cmd.Tag(), Status: uint8(res.Status),
		Sense: sense[:res.SenseLen]}, iuSize)
	if err != nil {
		return err
	}
	return t.post(ctx, transport.SendWR{Opcode: transport.WRSend, SGL: []transport.SGE{t.sge(sendOff, n)}})
}

// issue is the initiator side of one command: send an SRP_CMD with a direct descriptor for the
// data buffer at dataOff, wait for the SRP_RSP and check its status.
func issue(ctx context.Context, ini *demoEnd, tag uint64, cdb []byte, write bool, n int) error {
	desc := srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: ini.mem.Addr() + dataOff, Key: ini.mr.RKey(), Len: uint32(n)}}
	f := srp.CmdFields{CDB: cdb}
	binary.BigEndian.PutUint64(f.Tag[:], tag)
	if write {
		f.DataOut = desc
	} else {
		f.DataIn = desc
	}
	iu := ini.mem.Bytes()[sendOff : sendOff+iuSize]
	m, err := srp.Cmd(iu).Encode(&f)
	if err != nil {
		return err
	}
	if err := ini.post(ctx, transport.SendWR{Opcode: transport.WRSend, SGL: []transport.SGE{ini.sge(sendOff, m)}}); err != nil {
		return fmt.Errorf("initiator: SEND: %w", err)
	}
	wc, err := wait(ctx, ini.rcq)
	if err != nil {
		return err
	}
	slot := int(wc.ID)
	rsp, err := srp.ParseRsp(ini.mem.Bytes()[recvOff+slot*iuSize : recvOff+slot*iuSize+int(wc.ByteLen)])
	if err != nil {
		return fmt.Errorf("initiator: %w", err)
	}
	if err := ini.postRecv(slot); err != nil {
		return err
	}
	if rsp.Tag() != f.Tag {
		return fmt.Errorf("initiator: response tag %x, want %x", rsp.Tag(), f.Tag)
	}
	if st := scsi.Status(rsp.Status()); st != scsi.StatusGood {
		return fmt.Errorf("initiator: SCSI status %v, sense %x", st, rsp.Sense())
	}
	return nil
}

func rw16(op byte, lba uint64, blocks uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], blocks)
	return cdb
}

func runDemo(ctx context.Context, out io.Writer, cfg demoConfig) error {
	const bs = 512
	memSize := dataOff + cfg.maxIO
	ini, err := openEnd(ctx, cfg.addr, memSize)
	defer ini.close()
	if err != nil {
		return fmt.Errorf("initiator device: %w", err)
	}
	tgt, err := openEnd(ctx, cfg.addr, memSize)
	defer tgt.close()
	if err != nil {
		return fmt.Errorf("target device: %w", err)
	}
	ram, err := backend.NewRAM(cfg.lunSize, false)
	if err != nil {
		return err
	}
	lun, err := scsi.NewLUN(scsi.LUNConfig{BlockSize: bs, Serial: "srpd-demo-0"}, ram)
	if err != nil {
		return err
	}
	defer lun.Close()
	if err := ini.connectTo(tgt, cfg.mtu); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := tgt.connectTo(ini, cfg.mtu); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	for i := range nRecv {
		if err := ini.postRecv(i); err != nil {
			return err
		}
		if err := tgt.postRecv(i); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "softroce: initiator %v QPN %#x <-> target %v QPN %#x, path MTU %v\n",
		ini.dev.Addrs()[0], ini.qp.QPN(), tgt.dev.Addrs()[0], tgt.qp.QPN(), cfg.mtu)
	fmt.Fprintf(out, "LUN 0: RAM, %d MiB, %d-byte blocks, NAA %x\n", cfg.lunSize>>20, bs, lun.NAA())

	nexus := scsi.Nexus{}
	errc := make(chan error, 1)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			if err := serveOne(tctx, tgt, lun, nexus); err != nil {
				errc <- err
				return
			}
		}
	}()
	// The first command on a new LUN reports POWER ON unit attention; clear it with TEST UNIT
	// READY as a real initiator's scan does.
	tur := make([]byte, 16)
	_ = issue(ctx, ini, 0, tur, false, 0)

	rng := rand.New(rand.NewPCG(1, 2))
	blocks := uint64(cfg.lunSize / bs)
	want := make([]byte, cfg.maxIO)
	var moved int64
	start := time.Now()
	for i := range cfg.ios {
		n := (1 + rng.IntN(cfg.maxIO/bs)) * bs
		lba := rng.Uint64N(blocks - uint64(n/bs) + 1)
		buf := ini.mem.Bytes()[dataOff : dataOff+n]
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		copy(want, buf)
		if err := issue(ctx, ini, uint64(2*i+1), rw16(0x8a, lba, uint32(n/bs)), true, n); err != nil {
			return fmt.Errorf("write %d (%d bytes at LBA %d): %w", i, n, lba, err)
		}
		clear(buf)
		if err := issue(ctx, ini, uint64(2*i+2), rw16(0x88, lba, uint32(n/bs)), false, n); err != nil {
			return fmt.Errorf("read %d (%d bytes at LBA %d): %w", i, n, lba, err)
		}
		for j := range n {
			if buf[j] != want[j] {
				return fmt.Errorf("read %d: byte %d of %d at LBA %d differs: %#x, wrote %#x", i, j, n, lba, buf[j], want[j])
			}
		}
		moved += 2 * int64(n)
	}
	el := time.Since(start)
	select {
	case err := <-errc:
		return err
	default:
	}
	st := ini.dev.Stats()
	fmt.Fprintf(out, "%d WRITE(16)+READ(16) pairs, 512 B..%d KiB, every byte verified: %.1f MiB moved in %v (%.0f MiB/s, %.0f commands/s)\n",
		cfg.ios, cfg.maxIO>>10, float64(moved)/(1<<20), el.Round(time.Millisecond),
		float64(moved)/(1<<20)/el.Seconds(), float64(2*cfg.ios)/el.Seconds())
	fmt.Fprintf(out, "initiator device: %d packets sent, %d received, %d retransmits\n", st.TxPackets, st.RxPackets, st.Retransmits)
	return nil
}
