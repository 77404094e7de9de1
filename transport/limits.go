package transport

import "fmt"

// The checks of creation arguments against DeviceAttr that every engine makes the same way
// (rxe_qp_chk_cap, rxe_alloc_mr in torvalds/linux:drivers/infiniband/sw/rxe).

// CheckQPCap checks c against the device limits in a and returns it with SGE counts of zero
// raised to one (a WR may always carry one SGE). The error wraps ErrInvalidArgument.
func (a *DeviceAttr) CheckQPCap(c QPCap) (QPCap, error) {
	if c.MaxSendWR <= 0 || c.MaxRecvWR <= 0 || c.MaxSendWR > a.MaxQPWR || c.MaxRecvWR > a.MaxQPWR ||
		c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxSendSGE > a.MaxSGE || c.MaxRecvSGE > a.MaxSGE ||
		c.MaxInlineData < 0 || c.MaxInlineData > a.MaxInlineData {
		return c, fmt.Errorf("capabilities %+v exceed the device's (%d WRs, %d SGEs, %d inline bytes): %w",
			c, a.MaxQPWR, a.MaxSGE, a.MaxInlineData, ErrInvalidArgument)
	}
	c.MaxSendSGE, c.MaxRecvSGE = max(c.MaxSendSGE, 1), max(c.MaxRecvSGE, 1)
	return c, nil
}

// CheckFastRegPages checks the page-list length of a fast-reg MR (PD.AllocFastRegMR) against
// MaxMRPages. The error wraps ErrInvalidArgument.
func (a *DeviceAttr) CheckFastRegPages(maxPages int) error {
	if maxPages <= 0 || maxPages > a.MaxMRPages {
		return fmt.Errorf("fast-reg MR of %d pages (max %d): %w", maxPages, a.MaxMRPages, ErrInvalidArgument)
	}
	return nil
}
