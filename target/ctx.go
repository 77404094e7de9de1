package target

import (
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// ctxKind is what an ioCtx carries.
type ctxKind uint8

const (
	kCmd ctxKind = iota + 1 // SRP_CMD
	kTM                     // SRP_TSK_MGMT
)

// cstate is the phase of an ioCtx. Only the channel's loop goroutine changes it. Its String
// (cstate_string.go) is each constant's line comment.
type cstate uint8

//go:generate go tool stringer -type=cstate -linecomment -output=cstate_string.go

const (
	csFree cstate = iota // free
	// RDMA READ of external indirect tables in flight
	csTables // tables
	// RDMA READ of data-out in flight
	csFetch // fetch
	// in its LUN's queue or executing
	csExec // exec
	// task management waiting for the commands it aborted
	csTM // tm
	// transfer or response prepared, waiting for send-queue slots (then: next)
	csWaitSQ // waitsq
	// response (after any RDMA WRITEs) posted
	csSend // send
)

// ioCtx is one request slot of a channel: everything a command or task management request needs
// from its arrival to the completion of its response, preallocated at channel creation and
// reused (the command path does not allocate).
type ioCtx struct {
	ch    *channel
	idx   int
	gen   uint32 // incremented by reset: tells one use of the context from the next
	state cstate
	next  cstate // the state after csWaitSQ
	kind  ctxKind

	slot    int  // receive buffer held (-1: none)
	credit  bool // consumed a credit and owes a response (or a pending credit)
	inTags  bool
	tag     srp.Tag
	solNot  srp.SolNot
	lunAddr scsi.LUNAddress
	lun     *scsi.LUN
	start   time.Time // the SRP_CMD's arrival (latency statistics, lunstats.go)

	// SCSI
	cmd    scsi.Command
	info   scsi.CDBInfo
	cdbErr bool // LUNSet.Parse failed: no data moves, Execute reports the error
	res    scsi.Result
	hasPre bool // answered by the target without executing
	pre    scsi.Status
	preSns scsi.Sense
	sense  [scsi.MaxSenseLen]byte

	// descriptors
	out, in       descSet
	extOut, extIn bool
	outTotal      uint32 // indirect TOTAL LENGTH (checked against an external table)
	inTotal       uint32
	imm           []byte
	dOut, dIn     uint64 // bytes the descriptors describe
	xferOut       uint32

	// scheduler (guarded by lq.mu, except aborted and cctx)
	lq           *lunQueue
	qstate       uint8
	qLink, aLink qlink
	aborted      atomic.Bool
	cctx         cmdCtx
	waiters      []*ioCtx // task management requests waiting for this command

	// stall detection (channel.checkStalls): since when this use (gen) has been in state
	stallSince time.Time
	stallGen   uint32
	stallState cstate

	// task management
	tmWait atomic.Int32
	tmFunc srp.TaskMgmtFunc
	tmCode srp.TMResponse

	// memory (fixed at creation)
	data     []byte
	dataAddr uint64
	ext      []byte
	extAddr  uint64
	rsp      []byte
	rspAddr  uint64

	// data movement (preallocated at creation): an RW context moves the external tables, the
	// data-out (RDMA READ) and the data-in (RDMA WRITE, the SRP_RSP chained after it). rw is
	// the context's own (sized for rwSmall work requests) or, for a transfer needing more, one
	// of the channel's large ones, borrowed from the post until the transfer has completed
	// (needBig: prepared, waiting for one). remote and local hold the transfer prepared.
	rw      *frpool.RWCtx
	own     *frpool.RWCtx
	needBig bool
	remote  []frpool.RemoteSeg
	local   [1 + maxViews]transport.SGE
	nlocal  int // SGEs of local in use
	views   [maxViews][]byte
	sendWR  [1]transport.SendWR
	sendSGE [1]transport.SGE
	chain   frpool.Chain // the SRP_RSP alone (no data-in)
	withRW  bool         // csSend: the SRP_RSP follows the RDMA WRITEs of rw
	nwr     int          // send-queue slots the prepared post takes
	sqUsed  int          // send-queue slots held by the post in flight
	sqNextW *ioCtx       // send-queue wait FIFO
}

// maxViews bounds the pieces of backend memory a READ's data-in may be sent from
// (scsi.Command.DataInViews: a RAM LUN's 64 KiB chunks; 8 cover 448 KiB); a READ needing more is
// copied into the request slot.
const maxViews = 8

// RWDone implements frpool.RWOwner: the transfer of c.rw completed (or failed). The pool calls
// it from HandleSendCompletion (or Recover), i.e. on the channel's loop goroutine.
func (c *ioCtx) RWDone(_ *frpool.RWCtx, err error) { c.ch.rwDone(c, err) }

// exec runs the command on a LUN worker.
func (c *ioCtx) exec() {
	c.res = c.ch.view.set.Execute(&c.cctx, &c.cmd)
}

// tmRelease drops one of the things a task management request waits for; the last one hands
// the request back to its channel.
func (c *ioCtx) tmRelease() {
	if c.tmWait.Add(-1) == 0 {
		c.ch.post(event{kind: evTMDone, c: c})
	}
}

// reset prepares a free context for a new request.
func (c *ioCtx) reset(kind ctxKind, slot int) {
	c.gen++
	c.kind = kind
	c.slot = slot
	c.credit = false
	c.inTags = false
	c.solNot = 0
	c.lun = nil
	c.cmd = scsi.Command{}
	c.info = scsi.CDBInfo{}
	c.cdbErr = false
	c.res = scsi.Result{}
	c.hasPre = false
	c.out, c.in = descSet{}, descSet{}
	c.extOut, c.extIn = false, false
	c.imm = nil
	c.dOut, c.dIn, c.xferOut = 0, 0, 0
	c.lq = nil
	c.qstate = qNone
	c.aborted.Store(false)
	c.cctx.reset()
	c.waiters = nil
	c.tmWait.Store(0)
	c.nwr, c.sqUsed = 0, 0
	c.withRW, c.needBig = false, false
}
