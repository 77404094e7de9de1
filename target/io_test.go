package target

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestDescriptorFormats writes and reads back data with every descriptor format: direct,
// indirect with the whole list in the IU, indirect with an external table fetched by RDMA
// READ, and immediate data; every byte is checked against the model.
func TestDescriptorFormats(t *testing.T) {
	e := newEnv(t, envOpts{})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	rng := rand.New(rand.NewPCG(5, 6))
	lba := uint64(0)
	// RDMA transfers the channel's RW contexts must have completed: one per data transfer
	// (none for immediate data) and one per external table fetch.
	var transfers uint64
	count := func(m descMode) {
		switch m {
		case modeImmediate:
		case modeExternal:
			transfers += 2
		default:
			transfers++
		}
	}
	for mode := descMode(0); mode < nModes; mode++ {
		for _, blocks := range []uint32{1, 7, 16} {
			for _, pieces := range []int{1, 3, 16} {
				if mode == modeImmediate && int(blocks)*testBlock+srp.DefaultImmDataOffset > int(in.rsp.MaxITIULen) {
					continue
				}
				if mode == modeExternal && pieces == 1 {
					continue
				}
				w := &xfer{lun: 0, write: true, lba: lba, blocks: blocks, mode: mode}
				in.issue(w, pieces, rng)
				in.complete(w)
				count(w.mode)
				// Read back with another format.
				r := &xfer{lun: 0, lba: lba, blocks: blocks, mode: (mode + 1) % modeImmediate}
				in.issue(r, pieces+1, rng)
				in.complete(r)
				count(r.mode)
				lba += uint64(blocks)
				in.resetHeap()
			}
		}
	}
	st := in.ch.Stats()
	if st.ExtTables == 0 || st.ImmCommands == 0 || st.BadCommands != 0 || st.CmdErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The last data-in transfer completes when the target has its SEND's completion, which
	// may come after the initiator got the response.
	for deadline := time.Now().Add(waitLong); st.RWTransfers < transfers && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		st = in.ch.Stats()
	}
	if st.RWTransfers != transfers {
		t.Fatalf("%d RW transfers, want %d", st.RWTransfers, transfers)
	}
}

// TestResiduals checks the residual counts against descriptor lengths that differ from the
// CDB's transfer length.
func TestResiduals(t *testing.T) {
	e := newEnv(t, envOpts{})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	send := func(cdb []byte, out, inb *srp.DirectDesc) srp.Rsp {
		f := srp.CmdFields{Tag: in.newTag(), CDB: cdb}
		if out != nil {
			f.DataOut = srp.DataBuf{Format: srp.DescDirect, Direct: *out}
		}
		if inb != nil {
			f.DataIn = srp.DataBuf{Format: srp.DescDirect, Direct: *inb}
		}
		in.sendIU(in.cmdIU(&f))
		return in.await(f.Tag)
	}
	buf := in.alloc(64<<10, 4096)
	d := func(n int) *srp.DirectDesc { x := in.desc(region{buf.off, n}); return &x }
	cases := []struct {
		name     string
		cdb      []byte
		out, inb *srp.DirectDesc
		flags    srp.RspFlags
		doRes    uint32
		diRes    uint32
		status   uint8
	}{
		{"read, buffer larger", rw16(false, 0, 8), nil, d(8192), srp.DIUnder, 0, 4096, 0},
		{"read, buffer smaller", rw16(false, 0, 8), nil, d(1024), srp.DIOver, 0, 3072, 0},
		{"write, buffer larger", rw16(true, 0, 8), d(6000), nil, srp.DOUnder, 1904, 0, 0},
		{"inquiry short", []byte{scsi.OpInquiry, 0, 0, 0, 200, 0}, nil, d(200), srp.DIUnder, 0, 200 - 96, 0}, // standard INQUIRY data is 96 bytes,
		{"tur with a buffer", []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, d(512), srp.DIUnder, 0, 512, 0},
		// A WRITE whose buffer is too small: the command fails (short data-out) and reports
		// the overflow.
		{"write, buffer smaller", rw16(true, 0, 8), d(1024), nil, srp.DOOver, 3072, 0, uint8(scsi.StatusCheckCondition)},
	}
	for _, tc := range cases {
		r := send(tc.cdb, tc.out, tc.inb)
		if r.Status() != tc.status || r.Flags()&srp.ResidFlags != tc.flags || r.DataOutResid() != tc.doRes || r.DataInResid() != tc.diRes {
			t.Errorf("%s: status %#x flags %#x do %d di %d; want %#x %#x %d %d (sense %x)", tc.name, r.Status(),
				r.Flags()&srp.ResidFlags, r.DataOutResid(), r.DataInResid(), tc.status, tc.flags, tc.doRes, tc.diRes, r.Sense())
		}
	}
}

// TestRandomIO runs random mixed-size I/O (512 B .. 1 MiB, several commands in flight, every
// descriptor format, two LUNs) and checks every byte against a model; the lossy variant drops
// 1% of the packets in both directions.
func TestRandomIO(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults link.Faults
		ops    int
	}{
		{"clean", link.Faults{}, 160},
		{"loss1pct", link.Faults{Drop: 0.01}, 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops := tc.ops
			if raceEnabled {
				ops /= 2
			}
			if testing.Short() {
				ops /= 4
			}
			e := newEnv(t, envOpts{faults: tc.faults, nLUNs: 2, limits: Limits{QueueDepth: 8}})
			in := e.mustLogin(defaultLogin())
			in.clearUA(0, 1)
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			seed := rng.Uint64()
			t.Logf("seed %#x", seed)
			rng = rand.New(rand.NewPCG(seed, 8))
			const inflight = 6
			const region = 4 << 20 // each in-flight slot has its own LBA range
			total, reads, bigReads := 0, 0, 0
			for done := 0; done < ops; {
				batch := make([]*xfer, 0, inflight)
				in.resetHeap()
				for s := 0; s < inflight && done+len(batch) < ops; s++ {
					var size int
					switch rng.IntN(4) {
					case 0:
						size = 1 + rng.IntN(8) // small
					case 1:
						size = 1 + rng.IntN(128)
					default:
						size = 1 + rng.IntN(2048) // up to 1 MiB
					}
					x := &xfer{lun: uint16(rng.IntN(2)), write: rng.IntN(2) == 0, blocks: uint32(size),
						mode: descMode(rng.IntN(int(nModes)))}
					maxLBA := uint64(region/testBlock) - uint64(size)
					x.lba = uint64(s)*region/testBlock + rng.Uint64N(maxLBA+1)
					if x.mode == modeImmediate && (!x.write || size*testBlock+srp.DefaultImmDataOffset > int(in.rsp.MaxITIULen)) {
						x.mode = modeDirect
					}
					in.issue(x, 1+rng.IntN(24), rng)
					if !x.write {
						reads++
						if size*testBlock > maxViews<<16 {
							bigReads++ // more 64 KiB RAM chunks than views: copied into the slot
						}
					}
					batch = append(batch, x)
					total += size * testBlock
				}
				for _, x := range batch {
					in.complete(x)
				}
				done += len(batch)
			}
			st := in.ch.Stats()
			t.Logf("%d ops, %d MiB; channel: %d in, %d out, %d ext tables, %d imm, %d SQ waits, %d parked; link drops %d",
				ops, total>>20, st.BytesIn>>10, st.BytesOut>>10, st.ExtTables, st.ImmCommands, st.SQWaits, st.Parked,
				e.la.FaultStats().Dropped+e.lb.FaultStats().Dropped)
			if st.Errors != 0 || st.BadCommands != 0 {
				t.Fatalf("stats %+v", st)
			}
			// The LUNs are RAM and softroce sends process memory: READs go out of the LUN's
			// memory as it lies, except those needing more pieces than a request slot holds
			// (their data, as every byte read, matched the model above).
			t.Logf("%d reads, %d of them over more than %d RAM chunks; %d lent", reads, bigReads, maxViews, st.LentReads)
			if st.LentReads == 0 || st.LentReads > uint64(reads-bigReads) {
				t.Fatalf("%d READs sent from the LUN's memory, want between 1 and %d", st.LentReads, reads-bigReads)
			}
		})
	}
}

// BenchmarkSoftrocePipe runs I/O end to end (test initiator → softroce → in-memory link →
// softroce → target → RAM LUN) with 8 commands in flight: executed inline, and (-workers)
// with Limits.NoInline.
func BenchmarkSoftrocePipe(b *testing.B) {
	for _, noInline := range []bool{false, true} {
		suffix := ""
		if noInline {
			suffix = "-workers"
		}
		benchmarkSoftrocePipe(b, noInline, suffix)
	}
}

func benchmarkSoftrocePipe(b *testing.B, noInline bool, suffix string) {
	for _, bc := range []struct {
		name   string
		write  bool
		blocks uint32
	}{
		{"read4k", false, 8},
		{"write4k", true, 8},
		{"read64k", false, 128},
		{"write64k", true, 128},
	} {
		b.Run(bc.name+suffix, func(b *testing.B) {
			e := newEnv(b, envOpts{plainRAM: true, limits: Limits{QueueDepth: 16, NoInline: noInline}})
			in := e.mustLogin(defaultLogin())
			in.clearUA(0)
			rng := rand.New(rand.NewPCG(1, 1))
			const qd = 8
			xs := make([]*xfer, qd)
			b.SetBytes(int64(bc.blocks) * testBlock)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; {
				in.resetHeap()
				n := min(qd, b.N-i)
				for k := 0; k < n; k++ {
					xs[k] = &xfer{write: bc.write, lba: uint64(k) * uint64(bc.blocks), blocks: bc.blocks}
					in.issue(xs[k], 1, rng)
				}
				for k := 0; k < n; k++ {
					if r := in.await(xs[k].tag); r.Status() != 0 {
						b.Fatalf("status %#x", r.Status())
					}
				}
				i += n
			}
		})
	}
}
