package cqpoll

import (
	"fmt"

	"github.com/srpd/srpd/transport"
)

// Kind is the kind of a work request (a receive buffer, a command's SEND, a control IU, ...),
// carried in its ID, as SPDK's enum spdk_nvmf_rdma_wr_type is carried in the struct the wr_id
// points to. A Go wr_id cannot point into the Go heap, so the ID carries the kind and an index
// into the channel's own table instead.
type Kind uint8

// Work request ID layout: the kind in bits 56..62, an index in bits 0..31. Bit 63 is never
// the kind's: a layer below the channel that posts work requests with IDs of its own (the MR
// pool: frpool.WRIDTag) marks them with it (Router.Tagged).
const (
	kindShift = 56
	// MaxKinds is the number of kinds a WRID can carry.
	MaxKinds  = 1 << 7
	kindMask  = uint64(MaxKinds-1) << kindShift
	indexMask = uint64(1)<<32 - 1
)

// WRID is the work request ID of the work request of kind k at index i.
func WRID(k Kind, i uint32) uint64 { return uint64(k)<<kindShift | uint64(i) }

// KindOf is the kind a WRID carries.
func KindOf(id uint64) Kind { return Kind(id & kindMask >> kindShift) }

// IndexOf is the index a WRID carries.
func IndexOf(id uint64) uint32 { return uint32(id & indexMask) }

// Done handles the completion of a work request of one kind (ib_cqe.done); index is the one its
// WRID carries. An error is the channel's to act on (Handler.HandleCompletion returns it).
type Done func(wc *transport.WC, index uint32) error

// Router dispatches completions by the kind of their work request: one Done per kind, set up
// once with the channel, so that dispatching allocates nothing (a method value bound once, an
// indexed call per completion).
type Router struct {
	routes  [MaxKinds]Done
	tagBit  uint64
	tagged  func(wc *transport.WC) (deliver bool, err error)
	unknown Done
}

// Route makes fn handle the completions of kind k.
func (r *Router) Route(k Kind, fn Done) {
	if int(k) >= MaxKinds {
		panic(fmt.Sprintf("cqpoll: kind %d does not fit a WRID", k))
	}
	r.routes[k] = fn
}

// Tagged hands the completions whose ID has bit (a single bit outside the WRID's kind and
// index: bit 63) to fn first: the work requests a layer below posted under IDs of its own.
// When fn reports deliver, it has put the channel's WRID back in wc.ID (frpool's
// HandleSendCompletion does) and the completion is dispatched by kind; otherwise it is over.
func (r *Router) Tagged(bit uint64, fn func(wc *transport.WC) (deliver bool, err error)) {
	if bit == 0 || bit&(bit-1) != 0 || bit&(kindMask|indexMask) != 0 {
		panic(fmt.Sprintf("cqpoll: tag bit %#x overlaps the WRID layout", bit))
	}
	r.tagBit, r.tagged = bit, fn
}

// Unknown makes fn handle completions of a kind without a route (nil: they are ignored).
func (r *Router) Unknown(fn Done) { r.unknown = fn }

// Dispatch hands wc to the Done of its kind.
func (r *Router) Dispatch(wc *transport.WC) error {
	if wc.ID&r.tagBit != 0 && r.tagged != nil {
		deliver, err := r.tagged(wc)
		if err != nil || !deliver {
			return err
		}
	}
	fn := r.routes[KindOf(wc.ID)]
	if fn == nil || wc.ID&^(kindMask|indexMask) != 0 {
		if r.unknown == nil {
			return nil
		}
		fn = r.unknown
	}
	return fn(wc, IndexOf(wc.ID))
}
