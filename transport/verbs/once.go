//go:build verbs && linux && cgo

package verbs

import "sync"

// The objects of this engine are torn down once, by Close or by the device's Close, whichever
// comes first; a flag guarded by the object's (or the device's) lock says whether it has been.

// claimTeardown sets *done under mu and reports whether it was clear: true makes the caller
// the one that tears the object down.
func claimTeardown(mu sync.Locker, done *bool) bool {
	mu.Lock()
	defer mu.Unlock()
	if *done {
		return false
	}
	*done = true
	return true
}

// isSet reads *flag under mu.
func isSet(mu sync.Locker, flag *bool) bool {
	mu.Lock()
	defer mu.Unlock()
	return *flag
}
