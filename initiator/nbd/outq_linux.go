package nbd

import "golang.org/x/sys/unix"

// outq returns the bytes the socket fd has queued that its peer has not taken yet (SIOCOUTQ,
// which Linux defines as TIOCOUTQ: include/uapi/linux/sockios.h; for a unix stream socket
// the sender's sk_wmem_alloc, for TCP what is unsent or unacknowledged), or -1.
func outq(fd uintptr) int {
	n, err := unix.IoctlGetInt(int(fd), unix.TIOCOUTQ)
	if err != nil {
		return -1
	}
	return n
}
