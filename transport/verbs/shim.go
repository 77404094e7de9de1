//go:build verbs && linux && cgo

package verbs

// The C side: thin wrappers around libibverbs and librdmacm. ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_req_notify_cq and ibv_query_gid_ex are static inline in verbs.h, and the
// unions of ibv_send_wr / ibv_wc are awkward from Go, so work requests and completions cross
// the boundary as flat structs (shim_wr, shim_wc) that the C code turns into verbs structures.
// Blocking waits (completion channels, the CM event channel, async events) poll(2) the
// channel's fd together with an eventfd that Close writes to, so that every goroutine blocked
// in C can be stopped.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"unsafe"
)

// errnoErr wraps a C errno.
func errnoErr(op string, e error) error {
	if e == nil {
		return fmt.Errorf("verbs: %s failed", op)
	}
	return fmt.Errorf("verbs: %s: %w", op, e)
}

func negErrno(op string, r C.int) error {
	if r >= 0 {
		return nil
	}
	return fmt.Errorf("verbs: %s: %w", op, syscall.Errno(-r))
}

func posErrno(op string, r C.int) error {
	if r == 0 {
		return nil
	}
	if r < 0 {
		r = -r
	}
	return fmt.Errorf("verbs: %s: %w", op, syscall.Errno(r))
}

// deviceNames lists the RDMA devices libibverbs sees.
func deviceNames() ([]string, error) {
	buf := (*C.char)(C.malloc(8192))
	defer C.free(unsafe.Pointer(buf))
	n := C.shim_device_names(buf, 8192)
	if n < 0 {
		return nil, negErrno("ibv_get_device_list", n)
	}
	s := strings.TrimSpace(C.GoString(buf))
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\n"), nil
}

func toShimAddr(ap netip.AddrPort) C.struct_shim_addr {
	var a C.struct_shim_addr
	ip := ap.Addr().Unmap()
	a.port = C.uint16_t(ap.Port())
	if ip.Is4() {
		a.family = C.AF_INET
		b := ip.As4()
		for i := 0; i < 4; i++ {
			a.addr[i] = C.uint8_t(b[i])
		}
	} else {
		a.family = C.AF_INET6
		b := ip.As16()
		for i := 0; i < 16; i++ {
			a.addr[i] = C.uint8_t(b[i])
		}
	}
	return a
}

func fromShimAddr(a *C.struct_shim_addr) netip.AddrPort {
	switch a.family {
	case C.AF_INET:
		var b [4]byte
		for i := range b {
			b[i] = byte(a.addr[i])
		}
		return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(a.port))
	case C.AF_INET6:
		var b [16]byte
		for i := range b {
			b[i] = byte(a.addr[i])
		}
		return netip.AddrPortFrom(netip.AddrFrom16(b).Unmap(), uint16(a.port))
	}
	return netip.AddrPort{}
}
