package target

// credits is the request-limit bookkeeping of one channel (SRP rev16a 5.5; ib_srpt's req_lim and
// req_lim_delta), as the target sees the initiator's counter:
//
//   - the login response grants depth credits (reqLim = depth);
//   - every SRP_CMD and SRP_TSK_MGMT received consumes one (reqLim−1);
//   - every SRP_RSP returns 1 for the request it answers plus the credits of requests that
//     ended without a response (aborted commands: pending), so that an initiator that counts
//     exactly stays in step with us;
//   - an SRP_CRED_REQ returns pending credits when no response is coming to carry them.
//
// Invariant (checked by the fuzz test): reqLim + outstanding + pending == depth, where
// outstanding is the number of credit-consuming requests received and neither answered nor
// moved to pending. A request that arrives when reqLim is already 0 is an overrun: it is
// counted, and answered at once (SCSI BUSY / TM FUNCTION FAILED) with a delta of 1, which puts
// the counter back where it was; the overrun never gets a receive buffer held for it, so an
// initiator that ignores credits can only slow itself down (RNR NAKs), never exhaust us.
type credits struct {
	depth   int32
	reqLim  int32 // the initiator's credits as we account them (negative while overrun)
	pending int32 // credits owed to the initiator, returned with the next SRP_RSP or CRED_REQ
	// counters
	overruns uint64
	consumed uint64 // credit-consuming requests received
	returned uint64 // credits returned by responses and credit requests (excluding the login)
}

func newCredits(depth int) credits { return credits{depth: int32(depth), reqLim: int32(depth)} }

// consume accounts one credit-consuming request; ok is false if the initiator had none left.
func (c *credits) consume() (ok bool) {
	c.consumed++
	c.reqLim--
	if c.reqLim < 0 {
		c.overruns++
		return false
	}
	return true
}

// respond returns the REQUEST LIMIT DELTA for an SRP_RSP answering one request.
func (c *credits) respond() int32 {
	d := 1 + c.pending
	c.pending = 0
	c.reqLim += d
	c.returned += uint64(d)
	return d
}

// dropped accounts a request that ends without a response (an aborted command): its credit is
// owed.
func (c *credits) dropped() { c.pending++ }

// credReq takes the pending credits for an SRP_CRED_REQ (0: nothing to send).
func (c *credits) credReq() int32 {
	d := c.pending
	c.pending = 0
	c.reqLim += d
	c.returned += uint64(d)
	return d
}
