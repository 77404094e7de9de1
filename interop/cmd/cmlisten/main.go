// Command cmlisten is an interop probe for softroce's connection manager: it plays an SRP
// target just far enough for the Linux kernel's ib_srp to log in over RDMA CM (REQ → REP with
// an SRP_LOGIN_RSP → RTU), then logs everything that arrives on the connection. It never
// answers SRP_CMDs. With SRP_INTEROP_ROLE=initiator it plays the other side instead: it dials
// the kernel's ib_srpt with an SRP login (REQ), prints the SRP_LOGIN_RSP from the REP, and
// disconnects (DREQ → DREP).
//
// Environment (as /work/shared/interop/srp-interop kernel-initiator / kernel-target set it):
//
//	SRP_INTEROP_ADDR            address to bind UDP 4791 on (default 0.0.0.0)
//	SRP_INTEROP_PORT            RDMA CM port to listen on / dial (default 5555)
//	SRP_INTEROP_ROLE            "initiator" to dial
//	SRP_INTEROP_TARGET_ADDR     whom to dial
//	SRP_INTEROP_TARGET_PORT_ID  the 16-byte target port ID of the login request (hex)
//	CMLISTEN_DEBUG=1            debug logs of the engine (every MAD sent)
//
// It exits on SIGTERM or SIGINT. Build: go build ./interop/cmd/cmlisten (it lived in
// transport/softroce/internal before; it speaks SRP, which the transport does not know).
package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

const (
	maxIU       = 8260 // what ib_srpt offers: 8 KiB of data + the SRP_CMD header
	recvDepth   = 64
	reqLimDelta = 32
)

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if err := run(); err != nil {
		log.Fatalf("cmlisten: %v", err)
	}
}

func run() error {
	addr := netip.IPv4Unspecified()
	if s := os.Getenv("SRP_INTEROP_ADDR"); s != "" {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("SRP_INTEROP_ADDR: %w", err)
		}
		addr = a
	}
	port := uint16(5555)
	if s := os.Getenv("SRP_INTEROP_PORT"); s != "" {
		p, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return fmt.Errorf("SRP_INTEROP_PORT: %w", err)
		}
		port = uint16(p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	lnk, err := link.ListenUDP(ctx, netip.AddrPortFrom(addr, link.UDPPort), link.UDPOptions{})
	if err != nil {
		return err
	}
	logger := zap.NewNop()
	if os.Getenv("CMLISTEN_DEBUG") != "" {
		logger, _ = zap.NewDevelopment()
	}
	dev, err := softroce.Open(softroce.Config{Name: "cmlisten0", Link: lnk, Logger: logger})
	if err != nil {
		return err
	}
	cmc := dev.CMConfig()
	log.Printf("device %s on %v, CA GUID %#016x", dev.Name(), lnk.LocalAddrPort(), cmc.GUID)
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	if os.Getenv("SRP_INTEROP_ROLE") == "initiator" {
		err := dial(ctx, dev, pd, port)
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = dev.Close(cctx)
		st := dev.CMStats()
		log.Printf("QP1: %d MADs in, %d out, %d malformed, %d dropped", st.RxMADs, st.TxMADs, st.RxMalformed, st.RxDropped)
		return err
	}
	l, err := dev.Listen(addr, port)
	if err != nil {
		return err
	}
	log.Printf("listening on RDMA CM %v (service ID %#016x)", l.Addr(), uint64(0x0000000001060000)|uint64(port))

	var wg sync.WaitGroup
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("listener: %v", err)
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(ctx, dev, pd, req)
		}()
	}
	log.Printf("shutting down")
	_ = l.Close()
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = dev.Close(cctx)
	wg.Wait()
	st := dev.CMStats()
	log.Printf("QP1: %d MADs in, %d out, %d malformed, %d dropped, %d bad Q_Key; device: %+v",
		st.RxMADs, st.TxMADs, st.RxMalformed, st.RxDropped, st.RxBadQKey, dev.Stats())
	return err
}

func serve(ctx context.Context, dev *softroce.Device, pd transport.PD, req transport.ConnRequest) {
	info := req.Info()
	log.Printf("CM REQ from %v (packet %v → %v): remote QPN %#x, CA GUID %#016x, starting PSN %#x, path MTU %v, "+
		"resp res %d / init depth %d (our view), retry %d, rnr retry %d, flow control %v, SRQ %v",
		info.RemoteAddr, info.PacketSrc, info.PacketDst, info.RemoteQPN, info.RemoteCAGUID, info.StartingPSN,
		info.PathMTU, info.ResponderResources, info.InitiatorDepth, info.RetryCount, info.RNRRetryCount,
		info.FlowControl, info.SRQ)
	lr, err := srp.DecodeLoginReqRDMA(req.PrivateData())
	if err != nil {
		log.Printf("  not an SRP login (%v): private data %x", err, req.PrivateData())
		_ = req.Reject(nil, transport.RejectConsumerDefined)
		return
	}
	log.Printf("  SRP_LOGIN_REQ tag %v req_it_iu_len %d buf_fmt %#x flags %#02x imm_data_offset %d initiator %v target %v",
		lr.Tag, lr.ReqITIULen, uint16(lr.BufFmt), uint8(lr.Flags), lr.ImmDataOffset, lr.InitiatorPortID, lr.TargetPortID)

	itIU := min(lr.ReqITIULen, maxIU)
	scq, err1 := dev.CreateCQ(4 * recvDepth)
	rcq, err2 := dev.CreateCQ(4 * recvDepth)
	if err := errors.Join(err1, err2); err != nil {
		log.Printf("  CQs: %v", err)
		_ = req.Reject(nil, transport.RejectNoResources)
		return
	}
	qp, err := pd.CreateQP(transport.QPInitAttr{SendCQ: scq, RecvCQ: rcq,
		Cap: transport.QPCap{MaxSendWR: recvDepth, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		log.Printf("  QP: %v", err)
		_ = req.Reject(nil, transport.RejectNoResources)
		return
	}
	mem, err := dev.AllocMemory(recvDepth * int(itIU))
	if err != nil {
		log.Printf("  memory: %v", err)
		return
	}
	mr, err := pd.RegMR(mem.Addr(), uint64(mem.Len()), transport.AccessLocalWrite)
	if err != nil {
		log.Printf("  MR: %v", err)
		return
	}
	// Receive buffers first (QP in INIT), so that the initiator's first SEND finds one.
	if err := qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1},
		transport.AttrState|transport.AttrPort|transport.AttrPKeyIndex|transport.AttrAccessFlags); err != nil {
		log.Printf("  QP to INIT: %v", err)
		return
	}
	sge := func(i int) transport.SGE {
		return transport.SGE{Addr: mem.Addr() + uint64(i)*uint64(itIU), Length: itIU, LKey: mr.LKey()}
	}
	for i := 0; i < recvDepth; i++ {
		if err := qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{sge(i)}}}); err != nil {
			log.Printf("  post recv: %v", err)
			return
		}
	}

	rsp := make([]byte, srp.LoginRspLen)
	if _, err := srp.LoginRsp(rsp).Encode(&srp.LoginRspFields{
		ReqLimDelta: reqLimDelta, Tag: lr.Tag, MaxITIULen: itIU, MaxTIIULen: maxIU,
		BufFmt: srp.BufFormatDirect | srp.BufFormatIndirect,
	}); err != nil {
		log.Printf("  SRP_LOGIN_RSP: %v", err)
		return
	}
	log.Printf("  accepting on QPN %#x: SRP_LOGIN_RSP req_lim_delta %d max_it_iu_len %d max_ti_iu_len %d",
		qp.QPN(), reqLimDelta, itIU, maxIU)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	start := time.Now()
	conn, err := req.Accept(actx, qp, rsp, transport.ConnParam{FlowControl: true})
	cancel()
	if err != nil {
		log.Printf("  accept: %v", err)
		return
	}
	a := qp.Query()
	log.Printf("  ESTABLISHED after %v (RTU private data %d bytes): %v ↔ %v, QP %#x → peer QP %#x, sq_psn %#x rq_psn %#x, "+
		"path MTU %v, max_rd_atomic %d, max_dest_rd_atomic %d, timeout %d, retry %d, rnr retry %d",
		time.Since(start).Round(time.Microsecond), len(conn.PrivateData()), conn.LocalAddr(), conn.RemoteAddr(),
		qp.QPN(), a.DestQPN, a.SQPSN, a.RQPSN, a.PathMTU, a.MaxRdAtomic, a.MaxDestRdAtomic, a.Timeout, a.RetryCnt, a.RNRRetry)

	wcs := make([]transport.WC, 16)
	flushed := 0
	for {
		for {
			n := rcq.Poll(wcs)
			if n == 0 {
				break
			}
			for _, wc := range wcs[:n] {
				if wc.Status == transport.WCWRFlushErr {
					flushed++ // QP in ERR (disconnected): the posted buffers come back
					continue
				}
				if wc.Status != transport.WCSuccess {
					log.Printf("  recv completion %v (wr %d)", wc.Status, wc.ID)
					continue
				}
				i := int(wc.ID)
				iu := mem.Bytes()[i*int(itIU) : i*int(itIU)+int(wc.ByteLen)]
				logIU(iu)
				if err := qp.PostRecv([]transport.RecvWR{{ID: wc.ID, SGL: []transport.SGE{sge(i)}}}); err != nil {
					log.Printf("  repost: %v", err)
				}
			}
		}
		select {
		case <-rcq.Notify():
		case e, ok := <-conn.Events():
			if !ok {
				log.Printf("  connection released (%d receive buffers flushed)", flushed)
				return
			}
			why := ""
			if e.Reason != 0 {
				why += fmt.Sprintf(", REJ reason %v", e.Reason)
			}
			if e.Err != nil {
				why += fmt.Sprintf(", %v", e.Err)
			}
			log.Printf("  CM event %v%s (private data %d bytes); QP now %v", e.Type, why, len(e.PrivateData), qp.State())
		case <-ctx.Done():
			_ = conn.Disconnect(nil)
			return
		}
	}
}

func logIU(iu []byte) {
	if len(iu) == 0 {
		log.Printf("  RECV: empty SEND")
		return
	}
	op := srp.Opcode(iu[0])
	if op != srp.OpCmd {
		log.Printf("  RECV %d bytes: %v % x", len(iu), op, iu[:min(len(iu), 64)])
		return
	}
	c, err := srp.ParseCmd(iu, 0)
	if err != nil {
		log.Printf("  RECV %d bytes: SRP_CMD (unparsed: %v) % x", len(iu), err, iu[:min(len(iu), 64)])
		return
	}
	log.Printf("  RECV %d bytes: SRP_CMD tag %v LUN %v CDB % x (data-out %v, data-in %v)", len(iu), c.Tag(),
		c.LUN(), c.CDB(), c.DataOutFormat(), c.DataInFormat())
}

// dial logs in to the kernel target (ib_srpt) and logs out again.
func dial(ctx context.Context, dev *softroce.Device, pd transport.PD, port uint16) error {
	target, err := netip.ParseAddr(os.Getenv("SRP_INTEROP_TARGET_ADDR"))
	if err != nil {
		return fmt.Errorf("SRP_INTEROP_TARGET_ADDR: %w", err)
	}
	tpid, err := hex.DecodeString(os.Getenv("SRP_INTEROP_TARGET_PORT_ID"))
	if err != nil || len(tpid) != 16 {
		return fmt.Errorf("SRP_INTEROP_TARGET_PORT_ID %q: want 32 hex digits", os.Getenv("SRP_INTEROP_TARGET_PORT_ID"))
	}
	scq, err1 := dev.CreateCQ(64)
	rcq, err2 := dev.CreateCQ(64)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	qp, err := pd.CreateQP(transport.QPInitAttr{SendCQ: scq, RecvCQ: rcq,
		Cap: transport.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	lr := srp.LoginReq{ReqITIULen: maxIU, BufFmt: srp.BufFormatDirect | srp.BufFormatIndirect,
		Flags: srp.MultiChanSingle}
	copy(lr.Tag[:], "cmlisten")
	binary.BigEndian.PutUint64(lr.InitiatorPortID[8:], dev.CMConfig().GUID)
	copy(lr.TargetPortID[:], tpid)
	pdata := make([]byte, srp.LoginReqRDMALen)
	if _, err := lr.EncodeRDMA(pdata); err != nil {
		return err
	}
	remote := netip.AddrPortFrom(target, port)
	log.Printf("dialling %v: SRP_LOGIN_REQ initiator %v target %v, QPN %#x", remote, lr.InitiatorPortID, lr.TargetPortID, qp.QPN())
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	start := time.Now()
	conn, err := dev.Dial(dctx, remote, qp, pdata, transport.ConnParam{ResponderResources: 4, FlowControl: true})
	cancel()
	var rej *transport.RejectError
	if errors.As(err, &rej) {
		lj, perr := srp.ParseLoginRej(rej.PrivateData)
		if perr == nil {
			return fmt.Errorf("login rejected: CM reason %v, SRP_LOGIN_REJ reason %v", rej.Reason, lj.Reason())
		}
		return fmt.Errorf("rejected: CM reason %v, private data % x", rej.Reason, rej.PrivateData[:16])
	}
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	a := qp.Query()
	log.Printf("ESTABLISHED after %v: %v → %v, QP %#x → peer QP %#x, sq_psn %#x rq_psn %#x, max_rd_atomic %d, max_dest_rd_atomic %d, timeout %d",
		time.Since(start).Round(time.Microsecond), conn.LocalAddr(), conn.RemoteAddr(), qp.QPN(), a.DestQPN, a.SQPSN, a.RQPSN,
		a.MaxRdAtomic, a.MaxDestRdAtomic, a.Timeout)
	rsp, err := srp.ParseLoginRsp(conn.PrivateData())
	if err != nil {
		_ = conn.Disconnect(nil)
		return fmt.Errorf("REP private data is no SRP_LOGIN_RSP: %w", err)
	}
	f := rsp.Fields()
	log.Printf("SRP_LOGIN_RSP tag %q req_lim_delta %d max_it_iu_len %d max_ti_iu_len %d buf_fmt %#x flags %#x",
		f.Tag[:], f.ReqLimDelta, f.MaxITIULen, f.MaxTIIULen, uint16(f.BufFmt), uint8(f.Flags))
	time.Sleep(500 * time.Millisecond)
	if err := conn.Disconnect(nil); err != nil {
		return err
	}
	log.Printf("DREQ sent")
	for {
		select {
		case e, ok := <-conn.Events():
			if !ok {
				log.Printf("connection released")
				return nil
			}
			log.Printf("CM event %v; QP %v", e.Type, qp.State())
		case <-time.After(15 * time.Second):
			return errors.New("no DREP / timewait exit within 15 s")
		}
	}
}
