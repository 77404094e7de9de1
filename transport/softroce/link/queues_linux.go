package link

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// MaxQueues bounds the number of receive queues of ListenUDPQueues.
const MaxQueues = 64

// ErrQueues is returned by ListenUDPQueues for a queue count it cannot set up.
var ErrQueues = errors.New("link: UDP receive queues")

// ListenUDPQueues opens n UDP links bound to the same address and port (SO_REUSEPORT): the
// receive queues of a multi-queue device. The kernel steers every received datagram to link
// QueueOf(destination QP, n) with a classic BPF program attached to the group
// (SO_ATTACH_REUSEPORT_CBPF, which runs on the UDP payload: the BTH's destination QP is in
// bytes 5-7 — torvalds/linux:net/core/sock_reuseport.c run_bpf_filter pulls the UDP header
// before it runs the program), so a QP's packets always reach the same socket, whichever peer
// sends them: kernel rxe peers, which send every QP's packets to port 4791, need nothing of
// us. A datagram too short to hold a BTH makes the program fail; the kernel then picks a
// socket by hash, and whichever link gets it drops it as malformed. A GRO super-packet is
// steered by its first segment: a receiver must hand a packet that reached the wrong queue
// to the right one (softroce's device group does).
//
// n == 1 is ListenUDP. Each link has its own socket, buffers and counters; close every one.
// ctx bounds the setup only.
func ListenUDPQueues(ctx context.Context, addr netip.AddrPort, opts UDPOptions, n int) ([]*UDP, error) {
	if n < 1 || n > MaxQueues {
		return nil, fmt.Errorf("%w: %d queues (1 to %d)", ErrQueues, n, MaxQueues)
	}
	if n == 1 {
		u, err := ListenUDP(ctx, addr, opts)
		if err != nil {
			return nil, err
		}
		return []*UDP{u}, nil
	}
	links := make([]*UDP, 0, n)
	fail := func(err error) ([]*UDP, error) {
		for _, u := range links {
			_ = u.Close()
		}
		return nil, err
	}
	for i := 0; i < n; i++ {
		u, err := listenUDP(ctx, addr, opts, true)
		if err != nil {
			return fail(fmt.Errorf("%w: queue %d: %w", ErrQueues, i, err))
		}
		links = append(links, u)
		if i == 0 {
			// Port 0 picked an ephemeral port: the other queues join it. The program is
			// the group's; attached before the others join, it steers from the start (an
			// index beyond the sockets present falls back to the hash).
			addr = u.LocalAddrPort()
			if err := attachSteering(u, n); err != nil {
				return fail(fmt.Errorf("%w: steering program: %w", ErrQueues, err))
			}
		}
	}
	return links, nil
}

// steeringProgram is the classic BPF program of ListenUDPQueues: A = destination QP (BTH
// bytes 4-7, the reserved byte masked off); QP1 → 0; else A mod n. Instruction codes from
// torvalds/linux:include/uapi/linux/bpf_common.h and filter.h.
func steeringProgram(n int) []unix.SockFilter {
	const (
		ldAbsW = 0x00 | 0x00 | 0x20 // BPF_LD | BPF_W | BPF_ABS
		andK   = 0x04 | 0x50 | 0x00 // BPF_ALU | BPF_AND | BPF_K
		jeqK   = 0x05 | 0x10 | 0x00 // BPF_JMP | BPF_JEQ | BPF_K
		modK   = 0x04 | 0x90 | 0x00 // BPF_ALU | BPF_MOD | BPF_K
		retA   = 0x06 | 0x10        // BPF_RET | BPF_A
		retK   = 0x06 | 0x00        // BPF_RET | BPF_K
	)
	return []unix.SockFilter{
		{Code: ldAbsW, K: 4},
		{Code: andK, K: 0x00FFFFFF},
		{Code: jeqK, Jt: 2, Jf: 0, K: 1}, // QP1: to "ret #0"
		{Code: modK, K: uint32(n)},
		{Code: retA},
		{Code: retK, K: 0},
	}
}

func attachSteering(u *UDP, n int) error {
	prog := steeringProgram(n)
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	var err error
	cerr := u.rc.Control(func(fd uintptr) {
		err = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fp)
	})
	return errors.Join(cerr, err)
}
