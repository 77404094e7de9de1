package target

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Serve takes connection requests from ln until ctx ends, ln fails or the target is closed,
// and runs the login of each: the login request is decoded from the CM private data, decided,
// and answered with a CM REJ carrying SRP_LOGIN_REJ (reason "consumer defined"), or with a
// REP carrying SRP_LOGIN_RSP once the channel's QP, CQ and receive ring exist on dev. Serve
// returns nil when ctx ends or the target closes; logins in progress are finished (bounded)
// before it returns. It does not close ln.
//
// Half-open logins (REP sent, no RTU yet) are what a forged connection request costs us, so
// they are bounded by the target's Budget: a per-source rate, a per-source and a total
// number of pending logins where a new request evicts the oldest pending one of its own
// source (or of the busiest source) instead of waiting for a slot, and an RTU timeout that
// shrinks under pressure. A legitimate initiator's login, which completes in a round trip,
// therefore never waits behind forged ones from any source.
func (t *Target) Serve(ctx context.Context, ln transport.Listener, dev transport.Device) error {
	t.serving.Add(1)
	defer t.serving.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // Close ends Serve
		select {
		case <-t.closeCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		if t.isClosing() {
			return nil
		}
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || t.isClosing() {
				return nil
			}
			return err
		}
		src := req.Info().RemoteAddr
		actx, done, ok := t.budget.admitRequest(ctx, src.Addr())
		if !ok {
			t.rejectRequest(req, CauseLoginRate)
			continue
		}
		t.serving.Add(1)
		go func() {
			defer t.serving.Done()
			defer done()
			t.handleConnRequest(actx, req, dev)
		}()
	}
}

// rejectRequest answers a connection request that is not even decided with SRP_LOGIN_REJ
// "insufficient resources" (the tag echoed when the private data has one).
func (t *Target) rejectRequest(cr transport.ConnRequest, c RejectCause) {
	ri := cr.Info()
	var lr srp.LoginReq
	if r, err := ParseLoginReq(cr.PrivateData()); err == nil {
		lr = r
	}
	d := LoginDecision{Rej: srp.LoginRejFields{Reason: srp.RejInsufficientResources, Tag: lr.Tag, BufFmt: t.lim.BufFormats}, Cause: c}
	t.loginRejected(&lr, ConnInfo{Local: ri.LocalAddr, Remote: ri.RemoteAddr}, &d, nil)
	var rej [srp.LoginRejLen]byte
	_, _ = srp.LoginRej(rej[:]).Encode(&d.Rej)
	_ = cr.Reject(rej[:], transport.RejectConsumerDefined)
}

func (t *Target) isClosing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closing
}

// handleConnRequest runs one login over the CM.
func (t *Target) handleConnRequest(ctx context.Context, cr transport.ConnRequest, dev transport.Device) {
	ri := cr.Info()
	info := ConnInfo{Local: ri.LocalAddr, Remote: ri.RemoteAddr, InitiatorDepth: ri.InitiatorDepth, DepthKnown: true}
	var rej [srp.LoginRejLen]byte
	req, err := ParseLoginReq(cr.PrivateData())
	if err != nil {
		t.stats.loginsRejected.Add(1)
		t.stats.rejects[CauseMalformed].Add(1)
		if ok, n := t.rejLog.allow(ri.RemoteAddr.Addr(), CauseMalformed, time.Now()); ok {
			t.log.Info("login rejected: malformed login request", zap.Stringer("remote", ri.RemoteAddr),
				zap.Int("not_logged_since", n), zap.Error(err))
		}
		_, _ = srp.LoginRej(rej[:]).Encode(&srp.LoginRejFields{Reason: srp.RejUnableEstablishChannel, BufFmt: t.lim.BufFormats})
		_ = cr.Reject(rej[:], transport.RejectConsumerDefined)
		return
	}
	pc, d, _ := t.Login(dev, req, info)
	if !d.Accepted {
		_, _ = srp.LoginRej(rej[:]).Encode(&d.Rej)
		if err := cr.Reject(rej[:], transport.RejectConsumerDefined); err != nil {
			t.log.Debug("sending REJ", zap.Error(err))
		}
		return
	}
	param := transport.ConnParam{
		// We never let the initiator read from us; accept what it offers anyway (ib_srpt: 4).
		ResponderResources: min(ri.ResponderResources, t.lim.MaxInitiatorDepth),
		// RDMA READs towards the initiator: at least 1, at most what it offers.
		InitiatorDepth: max(1, min(ri.InitiatorDepth, t.lim.MaxInitiatorDepth)),
		RNRRetryCount:  7,
		FlowControl:    true,
	}
	// ctx bounds the wait for the RTU (the budget's login timeout, or an eviction).
	conn, err := cr.Accept(ctx, pc.QP(), pc.LoginRsp(), param)
	if err != nil {
		t.stats.loginsUnfinished.Add(1)
		if ok, n := t.acceptLog.allow(ri.RemoteAddr.Addr(), CauseNone, time.Now()); ok {
			t.log.Info("login accepted but the connection failed", zap.Stringer("remote", ri.RemoteAddr),
				zap.Int("not_logged_since", n), zap.Error(err))
		}
		pc.Abort()
		return
	}
	ch, err := pc.Establish(conn)
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			t.log.Warn("starting channel", zap.Error(err))
		}
		_ = conn.Disconnect(nil)
		return
	}
	if t.onChannel != nil {
		t.onChannel(ch, req.InitiatorPortID, ri.RemoteAddr)
	}
}
