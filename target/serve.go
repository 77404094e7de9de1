package target

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// maxPendingLogins bounds the connection requests one Serve handles at once.
const maxPendingLogins = 64

// acceptTimeout bounds the wait for the initiator's RTU after our REP.
const acceptTimeout = 30 * time.Second

// Serve takes connection requests from ln until ctx ends, ln fails or the target is closed,
// and runs the login of each: the login request is decoded from the CM private data, decided,
// and answered with a CM REJ carrying SRP_LOGIN_REJ (reason "consumer defined"), or with a
// REP carrying SRP_LOGIN_RSP once the channel's QP, CQ and receive ring exist on dev. Serve
// returns nil when ctx ends or the target closes; logins in progress are finished (bounded)
// before it returns. It does not close ln.
func (t *Target) Serve(ctx context.Context, ln transport.Listener, dev transport.Device) error {
	sem := make(chan struct{}, maxPendingLogins)
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
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			_ = req.Reject(nil, transport.RejectConsumerDefined)
			return nil
		}
		t.serving.Add(1)
		go func() {
			defer t.serving.Done()
			defer func() { <-sem }()
			t.handleConnRequest(ctx, req, dev)
		}()
	}
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
		t.log.Info("login rejected: malformed login request", zap.Stringer("remote", ri.RemoteAddr), zap.Error(err))
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
	actx, cancel := context.WithTimeout(ctx, acceptTimeout)
	conn, err := cr.Accept(actx, pc.QP(), pc.LoginRsp(), param)
	cancel()
	if err != nil {
		t.log.Info("login accepted but the connection failed", zap.Stringer("remote", ri.RemoteAddr), zap.Error(err))
		pc.Abort()
		return
	}
	if _, err := pc.Establish(conn); err != nil {
		if !errors.Is(err, ErrClosed) {
			t.log.Warn("starting channel", zap.Error(err))
		}
		_ = conn.Disconnect(nil)
	}
}
