package initiator

// Logging a channel in, after ib_srp.c (srp_send_req, srp_cm_rep_handler): the SRP_LOGIN_REQ
// in the connection request, negotiating down after a rejection, and installing the
// connection the SRP_LOGIN_RSP describes.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// loginParams are what logins ask for; they only ever go down (negotiation).
type loginParams struct {
	itIULen uint32
	bufFmt  srp.BufFormats
	imm     bool
}

// connParams are what one login negotiated.
type connParams struct {
	txIULen  int  // MAX IT IU LEN in force: our SRP_CMD IUs never exceed it
	rxIULen  int  // MAX TI IU LEN: size of our receive buffers
	maxDescs int  // direct descriptors per command (1: direct only)
	maxImm   int  // largest immediate-data write (0: none)
	remInv   bool // the target answers with SEND_WITH_INV (srp.ExtRemoteInvalidate granted)
	credits  int32
}

func (s *Session) initialLoginParams() loginParams {
	cfg := &s.cfg
	lp := loginParams{bufFmt: srp.BufFormatDirect, imm: !cfg.DisableImmediateData && cfg.MaxImmediateData > 0}
	maxRegs := s.maxRegs()
	n := srp.CmdHdrLen + srp.DirectDescLen
	if maxRegs > 1 {
		lp.bufFmt |= srp.BufFormatIndirect
		n = srp.CmdHdrLen + srp.IndirectHdrLen + maxRegs*srp.DirectDescLen
	}
	if lp.imm {
		n = max(n, srp.DefaultImmDataOffset+cfg.MaxImmediateData)
	}
	if cfg.MaxITIULen != 0 && uint32(n) > cfg.MaxITIULen {
		n = int(cfg.MaxITIULen)
	}
	lp.itIULen = uint32(n)
	return lp
}

func (s *Session) maxRegs() int {
	mrBytes := s.cfg.MaxPagesPerMR * pageSize
	n := min(s.cfg.CmdSGEntries, (s.cfg.MaxIOSize+mrBytes-1)/mrBytes)
	if s.cfg.DisableIndirect {
		n = 1
	}
	return n
}

// smallerIULen is the next IU length to try after a target found len too large: a ladder of
// immediate-data sizes (68 + 2^k) and then descriptor-only sizes, down to 64.
func smallerIULen(n uint32) uint32 {
	for _, c := range [...]uint32{8260, 4164, 2116, 1092, 580, 324, 196, 132, 100, 84, 64} {
		if c < n {
			return c
		}
	}
	return 0
}

// login connects c with a new QP and logs it in (loginMu held). multi selects MULTI-CHANNEL
// ACTION MULTI (keep the nexus' other channels) instead of SINGLE.
func (s *Session) login(ctx context.Context, c *channel, multi bool) error {
	cfg := &s.cfg
	for {
		lp := s.lp
		qp, err := c.newQP()
		if err != nil {
			return fmt.Errorf("initiator: channel %d: creating QP: %w", c.idx, err)
		}
		s.loginSeq++
		req := srp.LoginReq{
			ReqITIULen:      lp.itIULen,
			BufFmt:          lp.bufFmt,
			Flags:           srp.MultiChanSingle,
			InitiatorPortID: s.iport,
			TargetPortID:    cfg.TargetPortID,
		}
		binary.BigEndian.PutUint64(req.Tag[:], s.loginSeq)
		if multi {
			req.Flags = srp.MultiChanMulti
		}
		if lp.imm {
			req.Flags |= srp.ImmedRequested
			req.ImmDataOffset = srp.DefaultImmDataOffset
		}
		if !cfg.DisableRemoteInvalidate {
			req.Ext |= srp.ExtRemoteInvalidate
		}
		var buf [srp.LoginReqLen]byte
		var n int
		if cfg.LoginForm == LoginIBCM {
			n, err = req.Encode(buf[:])
		} else {
			n, err = req.EncodeRDMA(buf[:])
		}
		if err != nil {
			_ = qp.Close()
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		conn, err := cfg.Dialer.Dial(dctx, qp, buf[:n], cfg.ConnParam)
		cancel()
		if err != nil {
			_ = qp.Close()
			var rej *transport.RejectError
			if !errors.As(err, &rej) {
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					// No REP and no REJ within ConnectTimeout: no CM answered at all.
					return fmt.Errorf("initiator: channel %d: connecting: %w (nothing answers on that CM port: check port and target)", c.idx, err)
				}
				return fmt.Errorf("initiator: channel %d: connecting: %w", c.idx, err)
			}
			lre := &LoginRejectError{Channel: c.idx, CMReason: rej.Reason, ReqITIULen: lp.itIULen,
				InitiatorPortID: req.InitiatorPortID, TargetPortID: req.TargetPortID}
			if lr, perr := srp.ParseLoginRej(rej.PrivateData); perr == nil {
				lre.Reason, lre.BufFmt = lr.Reason(), lr.BufFmt()
				lre.TargetPortHint, lre.HasTargetPortHint = srp.ParsePortHint(rej.PrivateData)
			}
			switch lre.Reason {
			case srp.RejITIULenTooLarge:
				if next := smallerIULen(lp.itIULen); next != 0 {
					s.log.Info("target refuses the IU length; negotiating down", zap.Int("ch", c.idx),
						zap.Uint32("rejected", lp.itIULen), zap.Uint32("next", next))
					s.lp.itIULen = next
					continue
				}
			case srp.RejUnsupportedDescFormat:
				if lp.bufFmt&srp.BufFormatIndirect != 0 && (lre.BufFmt == 0 || lre.BufFmt&srp.BufFormatDirect != 0) {
					s.log.Info("target refuses indirect descriptors; retrying with direct descriptors only", zap.Int("ch", c.idx))
					s.lp.bufFmt = srp.BufFormatDirect
					continue
				}
			}
			return lre
		}
		p, err := s.checkLoginRsp(conn.PrivateData(), &req)
		if err == nil {
			err = c.activate(qp, conn, p)
		}
		if err != nil {
			_ = conn.Disconnect(nil)
			_ = qp.Close()
			if c.qp == qp {
				c.qp, c.conn, c.events = nil, nil, nil
			}
			return fmt.Errorf("initiator: channel %d: %w", c.idx, err)
		}
		c.log.Info("channel logged in", zap.Uint32("qpn", qp.QPN()), zap.Bool("multi", multi),
			zap.Int32("credits", p.credits), zap.Int("max_it_iu_len", p.txIULen), zap.Int("max_ti_iu_len", p.rxIULen),
			zap.Int("max_descriptors", p.maxDescs), zap.Int("max_immediate", p.maxImm),
			zap.Bool("remote_invalidate", p.remInv))
		return nil
	}
}

// checkLoginRsp validates an SRP_LOGIN_RSP and derives the connection's parameters.
func (s *Session) checkLoginRsp(b []byte, req *srp.LoginReq) (connParams, error) {
	var p connParams
	rsp, err := srp.ParseLoginRsp(b)
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrLogin, err)
	}
	if rsp.Tag() != req.Tag {
		return p, fmt.Errorf("%w: tag %v, want %v", ErrLogin, rsp.Tag(), req.Tag)
	}
	if rsp.BufFmt()&srp.BufFormatDirect == 0 {
		return p, fmt.Errorf("%w: the target does not support direct descriptors (formats %#x)", ErrLogin, rsp.BufFmt())
	}
	tx := int(req.ReqITIULen)
	if m := int(rsp.MaxITIULen()); m < tx {
		tx = m // the target accepts less than we asked for: respect it
	}
	if tx < minITIULen {
		return p, fmt.Errorf("%w: MAX IT IU LEN %d is below %d", ErrLogin, tx, minITIULen)
	}
	rx := int(rsp.MaxTIIULen())
	if rx < srp.RspHdrLen+4 {
		return p, fmt.Errorf("%w: MAX TI IU LEN %d is too small for a response", ErrLogin, rx)
	}
	p.txIULen, p.rxIULen = tx, min(rx, maxTIIULen)
	p.maxDescs = 1
	if req.BufFmt&rsp.BufFmt()&srp.BufFormatIndirect != 0 {
		p.maxDescs = max(1, min(s.maxRegs(), (tx-srp.CmdHdrLen-srp.IndirectHdrLen)/srp.DirectDescLen))
	}
	if req.Flags&srp.ImmedRequested != 0 && rsp.Flags()&srp.ImmedSupported != 0 {
		p.maxImm = max(0, min(s.cfg.MaxImmediateData, tx-srp.DefaultImmDataOffset))
	}
	p.remInv = req.Ext&rsp.Ext()&srp.ExtRemoteInvalidate != 0
	p.credits = max(rsp.ReqLimDelta(), 0)
	return p, nil
}

// activate installs a connection that has just logged in: IU buffers laid out for the
// negotiated lengths, receive buffers posted, MR pool (re)bound to the QP, credits. It runs on
// the goroutine that owns the channel (Dial, or the channel goroutine) while the channel is down.
func (c *channel) activate(qp transport.QP, conn transport.CMConn, p connParams) error {
	c.postMu.Lock()
	defer c.postMu.Unlock()
	qd := len(c.reqs)
	txStr := roundUp(p.txIULen, iuAlign)
	rxStr := roundUp(p.rxIULen, iuAlign)
	nTx := qd + nTMBufs + nCtrlBufs
	need := nTx*txStr + c.nRecv*rxStr
	if c.iuMem == nil || c.iuMem.Len() < need {
		if c.iuMR != nil {
			if err := c.iuMR.Close(); err != nil {
				return fmt.Errorf("initiator: deregistering IU buffers: %w", err)
			}
			c.iuMR = nil
		}
		if c.iuMem != nil {
			if err := c.iuMem.Free(); err != nil {
				return fmt.Errorf("initiator: freeing IU buffers: %w", err)
			}
			c.iuMem = nil
		}
		m, err := c.dev.AllocMemory(need)
		if err != nil {
			return fmt.Errorf("initiator: IU buffers: %w", err)
		}
		c.iuMem = m
	}
	if c.iuMR == nil {
		// Local access only: the target reaches our memory through the MR pool's registrations.
		mr, err := c.pd.RegMR(c.iuMem.Addr(), uint64(c.iuMem.Len()), transport.AccessLocalWrite)
		if err != nil {
			return fmt.Errorf("initiator: registering IU buffers: %w", err)
		}
		c.iuMR = mr
	}
	c.txOff, c.txStr, c.rxStr = 0, txStr, rxStr
	c.rxOff = nTx * txStr
	b := c.iuMem.Bytes()
	base := c.iuMem.Addr()
	for i := range c.reqs {
		r := &c.reqs[i]
		off := c.txOff + i*txStr
		r.iu = b[off : off+p.txIULen : off+p.txIULen]
		r.iuAddr = base + uint64(off)
	}
	for i := range c.tmBufs {
		c.tmBufs[i] = c.txOff + (qd+i)*txStr
	}
	for i := range c.ctrlBuf {
		c.ctrlBuf[i] = c.txOff + (qd+nTMBufs+i)*txStr
		c.ctrlBusy[i] = false
	}
	c.ctrlQ = c.ctrlQ[:0]
	c.leftover = c.leftover[:0]

	if c.pool == nil {
		attr := c.s.cfg.Device.Attr()
		pool, err := frpool.New(frpool.Config{
			Attr:     attr,
			PD:       c.pd,
			QP:       qp,
			MaxPages: c.s.cfg.MaxPagesPerMR,
			NumMRs:   qd*c.maxRegs + 8,
			SQDepth:  c.sqDepth,
			Logger:   c.log,
		})
		if err != nil {
			return fmt.Errorf("initiator: MR pool: %w", err)
		}
		c.pool = pool
	} else if err := c.pool.Recover(qp); err != nil {
		c.log.Warn("MR pool recovery incomplete", zap.Error(err))
	}
	c.qp, c.conn = qp, conn
	c.events = nil
	if conn != nil {
		c.events = conn.Events()
	}
	c.params = p
	c.capBytes.Store(int64(min(c.s.cfg.MaxIOSize, p.maxDescs*c.mrBytes)))
	c.recvPosted = 0
	for i := 0; i < c.nRecv; i++ {
		if err := c.postRecv(i); err != nil {
			return fmt.Errorf("initiator: posting receive buffers: %w", err)
		}
	}
	c.mu.Lock()
	c.reqLim = clampCredits(int64(p.credits), c.maxReqLim())
	c.ehReset = nil
	c.invQ = c.invQ[:0]
	c.tm.waiting = false
	c.state.Store(uint32(chLive))
	c.wakeCreditLocked()
	c.mu.Unlock()
	return nil
}

func (c *channel) postRecv(i int) error {
	off := c.rxOff + i*c.rxStr
	c.rsge[0] = transport.SGE{Addr: c.iuMem.Addr() + uint64(off), Length: uint32(c.params.rxIULen), LKey: c.iuMR.LKey()}
	c.rwr[0].ID = cqpoll.WRID(kindRecv, uint32(i))
	if err := c.qp.PostRecv(c.rwr[:]); err != nil {
		return err
	}
	c.recvPosted++
	return nil
}

func (c *channel) rxBuf(i int, n uint32) []byte {
	off := c.rxOff + i*c.rxStr
	return c.iuMem.Bytes()[off : off+int(n)]
}
