// Package sdnotify implements the sender side of systemd's service notification protocol
// (sd_notify(3)) without cgo or dependencies: datagrams of newline-separated VAR=value
// assignments sent to the unix socket named by $NOTIFY_SOCKET (a path, or an abstract socket
// written with a leading '@'), and the watchdog interval of $WATCHDOG_USEC / $WATCHDOG_PID.
//
// The daemon's life cycle with Type=notify and ExecReload=kill -HUP:
//
//	n := sdnotify.FromEnv(os.LookupEnv)        // disabled when not run by systemd
//	... start ...; n.Ready("serving 2 targets")
//	iv, err := sdnotify.WatchdogInterval(os.LookupEnv, os.Getpid())
//	go n.RunWatchdog(ctx, iv, logError)
//	on SIGHUP:  n.Reloading(); reload; n.Ready("reloaded")
//	on SIGTERM: n.Stopping(); shut down
package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupportedSocket: $NOTIFY_SOCKET names an address family this package cannot send to
// (systemd also accepts vsock: addresses, for VMs).
var ErrUnsupportedSocket = errors.New("sdnotify: unsupported NOTIFY_SOCKET address")

// Notifier sends notifications to the service manager. The zero Notifier (and nil) is disabled:
// every call is a no-op returning nil, so code need not check whether it runs under systemd.
type Notifier struct {
	socket string // "" = disabled; "@name" = abstract
}

// New returns a Notifier that sends to socket: an absolute path or "@abstract-name".
func New(socket string) *Notifier { return &Notifier{socket: socket} }

// FromEnv returns a Notifier for $NOTIFY_SOCKET as lookup reports it (os.LookupEnv). Without
// it, the Notifier is disabled.
func FromEnv(lookup func(string) (string, bool)) *Notifier {
	s, _ := lookup("NOTIFY_SOCKET")
	return &Notifier{socket: s}
}

// Enabled reports whether notifications go anywhere.
func (n *Notifier) Enabled() bool { return n != nil && n.socket != "" }

// Socket returns the socket notifications are sent to ("" when disabled).
func (n *Notifier) Socket() string {
	if n == nil {
		return ""
	}
	return n.socket
}

// Notify sends the assignments (e.g. "READY=1", "STATUS=up") as one datagram. A value with a
// newline is refused: the protocol is line-based.
func (n *Notifier) Notify(assignments ...string) error {
	if !n.Enabled() {
		return nil
	}
	for _, a := range assignments {
		if strings.ContainsRune(a, '\n') || !strings.Contains(a, "=") {
			return fmt.Errorf("sdnotify: invalid assignment %q (want VAR=value on one line)", a)
		}
	}
	addr, err := n.addr()
	if err != nil {
		return err
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return fmt.Errorf("sdnotify: %s: %w", n.socket, err)
	}
	defer conn.Close()
	msg := strings.Join(assignments, "\n") + "\n"
	if _, err := conn.Write([]byte(msg)); err != nil {
		return fmt.Errorf("sdnotify: send to %s: %w", n.socket, err)
	}
	return nil
}

func (n *Notifier) addr() (*net.UnixAddr, error) {
	switch {
	case strings.HasPrefix(n.socket, "/"):
		return &net.UnixAddr{Name: n.socket, Net: "unixgram"}, nil
	case strings.HasPrefix(n.socket, "@"):
		// Go maps a leading '@' to the abstract namespace (a leading NUL byte), as systemd does.
		return &net.UnixAddr{Name: n.socket, Net: "unixgram"}, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnsupportedSocket, n.socket)
}

// status turns a status text into STATUS=, keeping it on one line.
func status(text string) string {
	return "STATUS=" + strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(text)
}

// withStatus appends STATUS= when text is not empty.
func withStatus(a []string, text string) []string {
	if text != "" {
		a = append(a, status(text))
	}
	return a
}

// Ready tells the service manager that start-up (or a reload) is complete: READY=1, with an
// optional status line.
func (n *Notifier) Ready(statusText string) error {
	return n.Notify(withStatus([]string{"READY=1"}, statusText)...)
}

// Reloading announces a configuration reload: RELOADING=1 with MONOTONIC_USEC (required by
// Type=notify-reload, harmless otherwise). Send Ready when the reload is complete.
func (n *Notifier) Reloading(statusText string) error {
	if !n.Enabled() {
		return nil
	}
	usec, err := monotonicUsec()
	if err != nil {
		return err
	}
	return n.Notify(withStatus([]string{"RELOADING=1", "MONOTONIC_USEC=" + strconv.FormatUint(usec, 10)}, statusText)...)
}

// Stopping announces the beginning of shutdown: STOPPING=1.
func (n *Notifier) Stopping(statusText string) error {
	return n.Notify(withStatus([]string{"STOPPING=1"}, statusText)...)
}

// Status updates the free-form status line shown by systemctl status.
func (n *Notifier) Status(text string) error { return n.Notify(status(text)) }

// Watchdog pings the service manager's watchdog: WATCHDOG=1.
func (n *Notifier) Watchdog() error { return n.Notify("WATCHDOG=1") }

// ExtendTimeout asks for d more time to finish starting, reloading or stopping
// (EXTEND_TIMEOUT_USEC), e.g. while a large file backend is created.
func (n *Notifier) ExtendTimeout(d time.Duration) error {
	return n.Notify("EXTEND_TIMEOUT_USEC=" + strconv.FormatInt(d.Microseconds(), 10))
}

// Errno reports a failure errno to the service manager (ERRNO=), before exiting.
func (n *Notifier) Errno(errno unix.Errno) error {
	return n.Notify("ERRNO=" + strconv.Itoa(int(errno)))
}

func monotonicUsec() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("sdnotify: clock_gettime(CLOCK_MONOTONIC): %w", err)
	}
	return uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3, nil
}

// WatchdogInterval returns the watchdog timeout systemd expects pings within ($WATCHDOG_USEC),
// or 0 when the watchdog is off, or meant for another process ($WATCHDOG_PID set and not pid).
// Ping at half the interval or more often (RunWatchdog does).
func WatchdogInterval(lookup func(string) (string, bool), pid int) (time.Duration, error) {
	s, ok := lookup("WATCHDOG_USEC")
	if !ok || s == "" {
		return 0, nil
	}
	usec, err := strconv.ParseUint(s, 10, 63)
	if err != nil || usec == 0 {
		return 0, fmt.Errorf("sdnotify: invalid WATCHDOG_USEC %q", s)
	}
	if p, ok := lookup("WATCHDOG_PID"); ok && p != "" {
		wp, err := strconv.Atoi(p)
		if err != nil || wp <= 0 {
			return 0, fmt.Errorf("sdnotify: invalid WATCHDOG_PID %q", p)
		}
		if wp != pid {
			return 0, nil
		}
	}
	if usec > uint64(time.Duration(1<<63-1).Microseconds()) {
		return 0, fmt.Errorf("sdnotify: WATCHDOG_USEC %q is too large", s)
	}
	return time.Duration(usec) * time.Microsecond, nil
}

// RunWatchdog pings the watchdog every interval/2 until ctx ends. It returns at once when the
// Notifier is disabled or interval is 0. A failed ping goes to onError (if not nil) and pinging
// goes on: systemd restarts the service only if pings stop arriving.
func (n *Notifier) RunWatchdog(ctx context.Context, interval time.Duration, onError func(error)) {
	if !n.Enabled() || interval <= 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := n.Watchdog(); err != nil && onError != nil {
				onError(err)
			}
		}
	}
}
