// Package hostile holds adversarial tests that run against a real srpd process: the daemon is
// built from this module, started as a child on loopback (every socket in a temporary
// directory, softroce on its own UDP port of 127.0.0.1) and attacked from other 127.0.0.x
// addresses: random and malformed RoCEv2 packets, CM REQs with garbage private data, a CM REQ
// flood, a session flood and NBD protocol abuse. After each class of attack the tests check that
// srpd is alive, that its resident memory stays within a budget and that an NBD export
// established before the attacks still serves verified I/O (continuously, during the floods
// too). TestSoak holds 64 sessions × 4 channels with verified I/O and checks that memory and
// goroutine counts stay flat.
//
// The tests carry the build tag "hostile" so that `go test ./...` (make test) does not run them:
// `make test-hostile` runs everything but the soak (a few minutes), `make soak` the soak.
package hostile
