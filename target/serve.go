package target

import (
	"context"
	"errors"
	"net/netip"
	"sync"
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
	// Joining serving under t.mu, after checking closing: Close sets closing under t.mu before
	// it waits, so Add never races with that Wait (a Serve started as Close runs returns).
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		return nil
	}
	t.serving.Add(1)
	t.mu.Unlock()
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
	q := newLoginQueue()
	var workers sync.WaitGroup
	for range loginWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				l, ok := q.pop(ctx)
				if !ok {
					return
				}
				t.handleConnRequest(l, dev)
			}
		}()
	}
	defer func() {
		cancel()
		workers.Wait()
		for _, l := range q.drain() {
			t.rejectRequest(l.cr, CauseShuttingDown)
			l.done()
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
		src := req.Info().RemoteAddr.Addr()
		p, actx, done, ok := t.budget.admit(ctx, src)
		if !ok {
			t.rejectRequest(req, CauseLoginRate)
			continue
		}
		q.push(&queuedLogin{src: src, cr: req, ctx: actx, done: done, p: p})
	}
}

// errEvicted: a pending login gave its place and memory to a newer request.
var errEvicted = errors.New("target: pending login evicted for a newer request")

// loginWorkers is the number of logins Serve decides at once (creating a channel's resources
// is CPU work: about a millisecond each).
const loginWorkers = 2

// queuedLogin is an admitted connection request waiting for a login worker.
type queuedLogin struct {
	src  netip.Addr
	cr   transport.ConnRequest
	ctx  context.Context // bounds the login; cancelled when the budget evicts it
	done func()          // gives the pending slot back
	p    *pendingLogin
}

// loginQueue hands admitted connection requests to the login workers fairly: round robin
// over source addresses, and newest first within a source. A burst from some addresses then
// delays another address's login by at most one login per busy address, and a legitimate
// initiator that shares an address with a flood is served next for that address (the flood's
// older requests are the ones the budget evicts).
type loginQueue struct {
	mu     sync.Mutex
	notify chan struct{}
	bySrc  map[netip.Addr][]*queuedLogin // a stack per source
	ring   []netip.Addr                  // sources with queued logins, in service order
}

func newLoginQueue() *loginQueue {
	return &loginQueue{notify: make(chan struct{}, 1), bySrc: map[netip.Addr][]*queuedLogin{}}
}

func (q *loginQueue) push(l *queuedLogin) {
	q.mu.Lock()
	st, had := q.bySrc[l.src]
	q.bySrc[l.src] = append(st, l)
	if !had {
		q.ring = append(q.ring, l.src)
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// pop returns the next login to decide, waiting until there is one or ctx ends.
func (q *loginQueue) pop(ctx context.Context) (*queuedLogin, bool) {
	for {
		q.mu.Lock()
		if len(q.ring) > 0 {
			src := q.ring[0]
			st := q.bySrc[src]
			l := st[len(st)-1]
			st[len(st)-1] = nil
			st = st[:len(st)-1]
			copy(q.ring, q.ring[1:])
			q.ring = q.ring[:len(q.ring)-1]
			if len(st) == 0 {
				delete(q.bySrc, src)
			} else {
				q.bySrc[src] = st
				q.ring = append(q.ring, src)
			}
			more := len(q.ring) > 0
			q.mu.Unlock()
			if more { // pass the token on: another worker may take the next one
				select {
				case q.notify <- struct{}{}:
				default:
				}
			}
			return l, true
		}
		q.mu.Unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// drain empties the queue (Serve is returning).
func (q *loginQueue) drain() []*queuedLogin {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*queuedLogin
	for _, st := range q.bySrc {
		out = append(out, st...)
	}
	q.bySrc, q.ring = map[netip.Addr][]*queuedLogin{}, nil
	return out
}

// rejectRequest answers a connection request that is not even decided with SRP_LOGIN_REJ
// "insufficient resources" (the tag echoed when the private data has one).
func (t *Target) rejectRequest(cr transport.ConnRequest, c RejectCause) {
	ri := cr.Info()
	var lr srp.LoginReq
	if r, err := ParseLoginReq(cr.PrivateData()); err == nil {
		lr = r
	}
	d := LoginDecision{Rej: srp.LoginRejFields{Reason: srp.RejInsufficientResources, Tag: lr.Tag, BufFmt: t.limits().BufFormats}, Cause: c}
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

// handleConnRequest decides one login (on a login worker) and, if it is accepted, waits for
// the connection on a goroutine of its own.
func (t *Target) handleConnRequest(l *queuedLogin, dev transport.Device) {
	cr, ctx := l.cr, l.ctx
	if ctx.Err() != nil { // evicted or timed out while queued: never accepted, so a rejection (not unfinished)
		t.rejectRequest(cr, CauseLoginRate)
		l.done()
		return
	}
	ri := cr.Info()
	if ri.Device != nil {
		// A multi-queue device: the channel lives on the queue the request arrived on (that
		// of the initiator's QP), where the transport requires its QP.
		dev = ri.Device
	}
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
		_, _ = srp.LoginRej(rej[:]).Encode(&srp.LoginRejFields{Reason: srp.RejUnableEstablishChannel, BufFmt: t.limits().BufFormats})
		_ = cr.Reject(rej[:], transport.RejectConsumerDefined)
		l.done()
		return
	}
	pc, d, _ := t.login(dev, req, info, l.p)
	if !d.Accepted {
		var b [srp.LoginRejLen + srp.PortHintLen]byte
		n, _ := srp.LoginRej(b[:]).Encode(&d.Rej)
		if d.Cause == CauseTargetPortID {
			// Wrong target port ID: say ours (srp/porthint.go), which is how srpctl
			// discover learns it over the RDMA CM.
			n = srp.AppendPortHint(b[:], t.portID)
		}
		if err := cr.Reject(b[:n], transport.RejectConsumerDefined); err != nil {
			t.log.Debug("sending REJ", zap.Error(err))
		}
		l.done()
		return
	}
	param := transport.ConnParam{
		// We never let the initiator read from us; accept what it offers anyway (ib_srpt: 4).
		ResponderResources: min(ri.ResponderResources, t.limits().MaxInitiatorDepth),
		// RDMA READs towards the initiator: at least 1, at most what it offers.
		InitiatorDepth: max(1, min(ri.InitiatorDepth, t.limits().MaxInitiatorDepth)),
		RNRRetryCount:  7,
		FlowControl:    true,
	}
	t.serving.Add(1)
	go func() {
		defer t.serving.Done()
		defer l.done()
		t.connect(ctx, cr, pc, param, req.InitiatorPortID, l.p)
	}()
}

// connect sends the REP and waits for the RTU (bounded by ctx: the budget's login timeout, or
// an eviction), then starts the channel.
func (t *Target) connect(ctx context.Context, cr transport.ConnRequest, pc *PendingChannel, param transport.ConnParam, ini srp.PortID, p *pendingLogin) {
	ri := cr.Info()
	conn, err := cr.Accept(ctx, pc.QP(), pc.LoginRsp(), param)
	if err == nil && !t.budget.settle(p) {
		// Evicted in the instant the RTU came: its memory went to another login.
		_ = conn.Disconnect(nil)
		err = errEvicted
	}
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
		t.onChannel(ch, ini, ri.RemoteAddr)
	}
}
