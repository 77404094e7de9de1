package backend

import (
	"path/filepath"
	"testing"
)

// Run with: go test -run '^$' -bench . -benchmem ./scsi/backend/
// ReadAt and WriteAt must report 0 allocs/op.

const benchSize = 64 << 20

func benchBackends(b *testing.B) []struct {
	name string
	open func(b *testing.B) Backend
} {
	file := func(direct bool) func(b *testing.B) Backend {
		return func(b *testing.B) Backend {
			f, err := OpenFile(filepath.Join(b.TempDir(), "lun.img"),
				FileOptions{Create: true, Size: benchSize, Direct: direct})
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	return []struct {
		name string
		open func(b *testing.B) Backend
	}{
		{"ram", func(b *testing.B) Backend {
			r, err := NewRAM(benchSize, false)
			if err != nil {
				b.Fatal(err)
			}
			return r
		}},
		{"file", file(false)},
		{"file-direct", file(true)},
	}
}

// prefill writes the whole backend once, so the benchmarks measure steady state (RAM chunks
// allocated, file blocks allocated).
func prefill(b *testing.B, be Backend) {
	buf := alignedBuf(1<<20, 4096)
	for off := int64(0); off < be.Size(); off += int64(len(buf)) {
		if _, err := be.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
}

func bench4K(b *testing.B, write, parallel bool) {
	for _, k := range benchBackends(b) {
		b.Run(k.name, func(b *testing.B) {
			be := k.open(b)
			defer be.Close()
			prefill(b, be)
			const blocks = benchSize / 4096
			op := func(buf []byte, i int64) {
				off := (i * 7919 % blocks) * 4096 // scattered, 4 KiB-aligned
				var err error
				if write {
					_, err = be.WriteAt(buf, off)
				} else {
					_, err = be.ReadAt(buf, off)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			// Per-goroutine buffers, allocated before the clock starts.
			bufs := make(chan []byte, 256)
			for range cap(bufs) {
				bufs <- alignedBuf(4096, 4096)
			}
			b.SetBytes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			if parallel {
				b.RunParallel(func(pb *testing.PB) {
					buf := <-bufs
					for i := int64(0); pb.Next(); i++ {
						op(buf, i)
					}
				})
				return
			}
			buf := <-bufs
			i := int64(0)
			for b.Loop() {
				op(buf, i)
				i++
			}
		})
	}
}

func BenchmarkReadAt4K(b *testing.B)          { bench4K(b, false, false) }
func BenchmarkWriteAt4K(b *testing.B)         { bench4K(b, true, false) }
func BenchmarkReadAt4KParallel(b *testing.B)  { bench4K(b, false, true) }
func BenchmarkWriteAt4KParallel(b *testing.B) { bench4K(b, true, true) }
