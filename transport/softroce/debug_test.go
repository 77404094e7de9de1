package softroce

import (
	"fmt"
	"strings"
)

// dump formats the protocol state of every QP of d (test diagnostics).
func (d *Device) dump() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, q := range d.qps {
		fmt.Fprintf(&b, "qp %#x %v: req{psn %#x high %#x rd %d retry %v rnr %v win %v} comp{psn %#x op %d retry %d rnr %d started %v} "+
			"resp{psn %#x op %d nak %v hasWQE %v nstream %d} sq h%d r%d t%d rq h%d t%d retransAt %v ctl %+v ready %v\n",
			q.qpn, q.state, q.req.psn, q.req.high, q.req.rdAtomic, q.req.needRetry, q.req.waitRNR, q.req.waitWindow,
			q.comp.psn, q.comp.opcode, q.comp.retryCnt, q.comp.rnrRetry, q.comp.startedRetry,
			q.resp.psn, q.resp.opcode, q.resp.sentPSNNak, q.resp.hasWQE, q.resp.nstream,
			q.sqHead, q.sqReq, q.sqTail, q.rqHead, q.rqTail, !q.retransAt.IsZero(), q.ctl, q.inReady)
		for i := q.sqHead; i != q.sqTail; i++ {
			w := &q.sq[i&q.sqMask]
			fmt.Fprintf(&b, "  wqe %d %v st %d tx %v len %d sent %d rd %d psn [%#x,%#x]\n", i, w.wr.Opcode, w.state, w.tx, w.length, w.sent, w.rdRecv, w.firstPSN, w.lastPSN)
		}
		for i := range q.resp.res {
			r := &q.resp.res[i]
			if r.valid {
				fmt.Fprintf(&b, "  res %d [%#x,%#x] cur %#x resid %d streaming %v\n", i, r.firstPSN, r.lastPSN, r.curPSN, r.resid, r.streaming)
			}
		}
	}
	fmt.Fprintf(&b, "stats %+v\n", d.stats.snapshot())
	return b.String()
}
