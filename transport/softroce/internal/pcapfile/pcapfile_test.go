package pcapfile

import (
	"bytes"
	"io"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w, err := NewWriter(&b, LinkTypeEthernet, 0)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 123456000)
	w.WriteRecord(ts, []byte{1, 2}, []byte{3})
	w.WriteRecord(ts, []byte{4})
	r, err := NewReader(&b)
	if err != nil || r.LinkType != LinkTypeEthernet {
		t.Fatal(err)
	}
	d, n, got, err := r.Next(nil)
	if err != nil || string(d) != "\x01\x02\x03" || n != 3 || !got.Equal(ts) {
		t.Fatal(d, n, got, err)
	}
	if d, _, _, err = r.Next(d); err != nil || string(d) != "\x04" {
		t.Fatal(d, err)
	}
	if _, _, _, err = r.Next(d); err != io.EOF {
		t.Fatal(err)
	}
	if _, err := NewReader(bytes.NewReader([]byte("garbage garbage garbage!"))); err != ErrFormat {
		t.Fatal(err)
	}
}
