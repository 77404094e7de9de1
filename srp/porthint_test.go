package srp

import (
	"bytes"
	"testing"
)

func TestPortHint(t *testing.T) {
	id := MakePortID(0x0102030405060708, 0x1112131415161718)
	var pd [148]byte
	if _, err := LoginRej(pd[:]).Encode(&LoginRejFields{Reason: RejUnableAssociateChannel}); err != nil {
		t.Fatal(err)
	}
	n := AppendPortHint(pd[:], id)
	if n != 56 {
		t.Fatalf("length %d, want 56", n)
	}
	want := append([]byte("SRPD\x01\x00\x00\x00"), id[:]...)
	if !bytes.Equal(pd[32:56], want) {
		t.Fatalf("hint bytes % x, want % x", pd[32:56], want)
	}
	got, ok := ParsePortHint(pd[:])
	if !ok || got != id {
		t.Fatalf("ParsePortHint = %v, %v; want %v", got, ok, id)
	}
	// What must not read as a hint.
	for name, mut := range map[string]func(b []byte) []byte{
		"kernel REJ (zero padding)": func(b []byte) []byte { clear(b[32:]); return b },
		"short":                     func(b []byte) []byte { return b[:55] },
		"not an SRP_LOGIN_REJ":      func(b []byte) []byte { b[0] = byte(OpLoginRsp); return b },
		"other magic":               func(b []byte) []byte { b[33] = 'X'; return b },
		"other version":             func(b []byte) []byte { b[36] = 2; return b },
	} {
		b := mut(append([]byte(nil), pd[:]...))
		if _, ok := ParsePortHint(b); ok {
			t.Errorf("%s: read as a hint", name)
		}
	}
}

func FuzzParsePortHint(f *testing.F) {
	var pd [148]byte
	_, _ = LoginRej(pd[:]).Encode(&LoginRejFields{Reason: RejUnableAssociateChannel})
	AppendPortHint(pd[:], MakePortID(1, 2))
	f.Add(pd[:])
	f.Add(pd[:56])
	f.Add(pd[:32])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok := ParsePortHint(b)
		if !ok {
			return
		}
		// A hint read back is what AppendPortHint writes for it.
		var again [56]byte
		copy(again[:32], b[:32])
		AppendPortHint(again[:], id)
		if !bytes.Equal(again[32:37], b[32:37]) || !bytes.Equal(again[40:], b[40:56]) {
			t.Fatalf("hint % x does not round-trip (% x)", b[32:56], again[32:])
		}
	})
}
