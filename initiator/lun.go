package initiator

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// defaultMaxWriteSame bounds one WRITE SAME when the LUN reports no limit (Linux sd's
// SD_MAX_WS16_BLOCKS, torvalds/linux:drivers/scsi/sd.h).
const defaultMaxWriteSame = 0x7fffff

// modePageCaching is the Caching mode page (SBC-4 6.5.5), whose MODE SENSE reply carries the
// WP bit in its header.
const modePageCaching = 0x08

// LUNInfo is what discovery learned about a logical unit.
type LUNInfo struct {
	Number  uint64  // LUN number (single-level addressing), or the 8-byte address as a number
	Address srp.LUN // the 8-byte SAM LUN as REPORT LUNS gave it

	Vendor, Product, Revision string // standard INQUIRY
	Serial                    string // VPD 0x80 (may be empty)
	// ID is the logical unit's designator from VPD 0x83 (NAA preferred, then EUI-64, then T10
	// vendor ID, then SCSI name string), IDType its designator type name ("naa", "eui64",
	// "t10", "name"); empty when the LUN reports none.
	ID     []byte
	IDType string

	BlockSize    int    // logical block size in bytes
	Blocks       uint64 // capacity in logical blocks
	PhysBlockExp uint8  // logical blocks per physical block exponent
	ReadOnly     bool   // write protected (MODE SENSE WP bit)

	Provisioning     bool   // logical block provisioning management enabled (thin)
	UnmapSupported   bool   // UNMAP (VPD 0xB2 LBPU)
	WriteSameUnmap   bool   // WRITE SAME(16) with UNMAP (VPD 0xB2 LBPWS)
	ZeroesAfterUnmap bool   // unmapped blocks read as zeroes (LBPRZ)
	MaxTransfer      uint32 // MAXIMUM TRANSFER LENGTH in blocks (VPD 0xB0; 0: no limit)
	OptimalTransfer  uint32 // OPTIMAL TRANSFER LENGTH in blocks
	MaxUnmapLBAs     uint32 // MAXIMUM UNMAP LBA COUNT
	MaxUnmapDescs    uint32 // MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT
	MaxWriteSame     uint64 // MAXIMUM WRITE SAME LENGTH in blocks (0: none reported)
}

// IDString formats ID in hexadecimal with its type (e.g. "naa.6001405..."), or "" without one.
func (i LUNInfo) IDString() string {
	if len(i.ID) == 0 {
		return ""
	}
	if i.IDType == "t10" || i.IDType == "name" {
		return i.IDType + "." + string(bytes.TrimRight(i.ID, " \x00"))
	}
	return i.IDType + "." + hex.EncodeToString(i.ID)
}

// LUN is a logical unit of the target, with a block API: ReadAt, WriteAt, Flush, Discard and
// WriteZeroes. It implements the NBD server's Device interface (see NBDDevice for the error
// mapping). All methods are safe for concurrent use.
type LUN struct {
	s         *Session
	info      atomic.Pointer[LUNInfo]
	noWSame   atomic.Bool // WRITE SAME(16) was refused: write zeroes with WRITE(16)
	noLBAStat atomic.Bool // GET LBA STATUS was refused: every block is mapped
	bsShift   uint
	blockSize int
}

// Info returns what discovery learned about the logical unit.
func (l *LUN) Info() LUNInfo { return *l.info.Load() }

// Session returns the session the LUN belongs to.
func (l *LUN) Session() *Session { return l.s }

// Size is the capacity in bytes.
func (l *LUN) Size() int64 {
	i := l.info.Load()
	return int64(i.Blocks) * int64(i.BlockSize)
}

// BlockSize is the logical block size.
func (l *LUN) BlockSize() int { return l.blockSize }

// ReadOnly reports whether the LUN is write protected.
func (l *LUN) ReadOnly() bool { return l.info.Load().ReadOnly }

// CanDiscard reports whether Discard is supported (UNMAP, or WRITE SAME with UNMAP).
func (l *LUN) CanDiscard() bool {
	i := l.info.Load()
	return !i.ReadOnly && (i.UnmapSupported || i.WriteSameUnmap)
}

// LUNs returns the logical units found by the last discovery, in REPORT LUNS order.
func (s *Session) LUNs() []*LUN {
	s.lunMu.RLock()
	defer s.lunMu.RUnlock()
	return append([]*LUN(nil), s.luns...)
}

// LUN returns logical unit n, or nil.
func (s *Session) LUN(n uint64) *LUN {
	s.lunMu.RLock()
	defer s.lunMu.RUnlock()
	for _, l := range s.luns {
		if l.info.Load().Number == n {
			return l
		}
	}
	return nil
}

// ---- the block API ----

func (l *LUN) check(off int64, n int64) error {
	bs := int64(l.blockSize)
	if off < 0 || n < 0 || off%bs != 0 || n%bs != 0 || off+n > l.Size() || off+n < off {
		return fmt.Errorf("initiator: LUN %d: offset %d length %d: %w", l.info.Load().Number, off, n, ErrRange)
	}
	return nil
}

func (l *LUN) rwJob(j *job, op string, off int64, n int) {
	i := l.info.Load()
	*j = job{lun: i.Number, lunAddr: i.Address, op: op, rw: true, lba: uint64(off) >> l.bsShift,
		bs: l.blockSize, maxBlocks: int(i.MaxTransfer), total: n}
}

// ReadAt reads len(p) bytes at byte offset off (both multiples of the block size) with READ(16),
// split into commands the channels and the LUN's maximum transfer length allow.
func (l *LUN) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := l.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	var j job
	l.rwJob(&j, "READ(16)", off, len(p))
	j.buf = p
	return l.s.run(ctx, &j)
}

// ReadAtAsync is ReadAt without blocking: it calls done once with what ReadAt would return.
// When a request slot and a credit are free, p fits one command and commands have a timeout
// (Config.CommandTimeout not Off), the command is posted at once and done runs on the
// goroutine that handles its completion (the transport's receive goroutine, the channel's, or
// this one: transport.Progresser); otherwise, and whenever the command needs error handling,
// on a goroutine of its own. done must not block. ctx bounds the command like ReadAt's only where
// error handling runs (the command timeout bounds it in any case); p must stay untouched
// until done.
func (l *LUN) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	if err := l.check(off, int64(len(p))); err != nil || len(p) == 0 {
		done(err)
		return
	}
	var j job
	l.rwJob(&j, "READ(16)", off, len(p))
	j.buf = p
	l.startAsync(ctx, &j, done)
}

// WriteAtAsync is WriteAt without blocking, as ReadAtAsync is ReadAt.
func (l *LUN) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	if err := l.check(off, int64(len(p))); err != nil || len(p) == 0 {
		done(err)
		return
	}
	if l.ReadOnly() {
		done(fmt.Errorf("initiator: LUN %d: %w", l.info.Load().Number, ErrReadOnly))
		return
	}
	var j job
	l.rwJob(&j, "WRITE(16)", off, len(p))
	j.buf, j.write, j.fua = p, true, fua
	l.startAsync(ctx, &j, done)
}

// BeginPosts opens a bracket around the posts that follow (transport.PostBatcher), when the
// session's transport device batches posts: what the commands posted until the matching
// EndPosts transmit is sent together. Every BeginPosts must be followed by one EndPosts, soon,
// from a goroutine that does not wait for anything in between.
func (l *LUN) BeginPosts() {
	for _, b := range l.s.batchers {
		b.BeginPosts()
	}
}

// EndPosts ends a BeginPosts bracket.
func (l *LUN) EndPosts() {
	for _, b := range l.s.batchers {
		b.EndPosts()
	}
}

// startAsync posts j at once or leaves it to a goroutine running the synchronous path (only
// that path allocates: j itself stays on the caller's stack).
func (l *LUN) startAsync(ctx context.Context, j *job, done func(error)) {
	if l.s.submitAsync(ctx, j, done) {
		return
	}
	jj := *j
	go func() { done(l.s.run(ctx, &jj)) }()
}

// WriteAt writes p at byte offset off with WRITE(16); with fua the Force Unit Access bit is set
// and the data is durable when WriteAt returns. Small writes travel as immediate data when the
// target granted it.
func (l *LUN) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	if err := l.check(off, int64(len(p))); err != nil {
		return err
	}
	if l.ReadOnly() {
		return fmt.Errorf("initiator: LUN %d: %w", l.info.Load().Number, ErrReadOnly)
	}
	if len(p) == 0 {
		return nil
	}
	var j job
	l.rwJob(&j, "WRITE(16)", off, len(p))
	j.buf, j.write, j.fua = p, true, fua
	return l.s.run(ctx, &j)
}

// Flush makes every completed write durable: SYNCHRONIZE CACHE(16) over the whole LUN.
func (l *LUN) Flush(ctx context.Context) error {
	var j job
	l.single(&j, "SYNCHRONIZE CACHE(16)", dirNone)
	j.spec.cdbLen = len(scsi.AppendSynchronizeCache16(j.spec.cdb[:0], 0, 0, false))
	return l.s.run(ctx, &j)
}

// Discard deallocates [off, off+n) with UNMAP (or WRITE SAME(16) with UNMAP when that is all the
// LUN offers), split by the LUN's limits. The contents of the range become unspecified (zeroes if
// ZeroesAfterUnmap).
func (l *LUN) Discard(ctx context.Context, off, n int64) error {
	if err := l.check(off, n); err != nil {
		return err
	}
	i := l.info.Load()
	switch {
	case i.ReadOnly:
		return fmt.Errorf("initiator: LUN %d: %w", i.Number, ErrReadOnly)
	case !i.UnmapSupported && i.WriteSameUnmap:
		return l.writeSame(ctx, off, n, true)
	case !i.UnmapSupported:
		return fmt.Errorf("initiator: LUN %d: discard: %w", i.Number, ErrNotSupported)
	}
	lba, end := uint64(off)>>l.bsShift, uint64(off+n)>>l.bsShift
	maxDescs := 255 // keeps the parameter list within one 4 KiB page
	if i.MaxUnmapDescs > 0 && int(i.MaxUnmapDescs) < maxDescs {
		maxDescs = int(i.MaxUnmapDescs)
	}
	maxLBAs := uint64(0xffffffff)
	if i.MaxUnmapLBAs > 0 {
		maxLBAs = uint64(i.MaxUnmapLBAs)
	}
	descs := make([]scsi.UnmapDescriptor, 0, maxDescs)
	param := make([]byte, 0, 8+16*maxDescs)
	for lba < end {
		descs = descs[:0]
		total := uint64(0)
		for lba < end && len(descs) < maxDescs && total < maxLBAs {
			cnt := min(end-lba, maxLBAs-total, 0xffffffff)
			descs = append(descs, scsi.UnmapDescriptor{LBA: lba, Blocks: uint32(cnt)})
			lba += cnt
			total += cnt
		}
		param = scsi.AppendUnmapParams(param[:0], descs)
		var j job
		l.single(&j, "UNMAP", dirOut)
		j.spec.cdbLen = len(scsi.AppendUnmap(j.spec.cdb[:0], uint16(len(param))))
		j.spec.buf, j.spec.n = param, len(param)
		if err := l.s.run(ctx, &j); err != nil {
			return err
		}
	}
	return nil
}

// WriteZeroes makes [off, off+n) read as zeroes: WRITE SAME(16) with UNMAP when noUnmap is not
// set and the LUN both supports it and reads unmapped blocks as zeroes (as Linux sd does),
// WRITE SAME(16) of a zero block otherwise, and plain WRITE(16)s of zeroes for a LUN that
// refuses WRITE SAME.
func (l *LUN) WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error {
	if err := l.check(off, n); err != nil {
		return err
	}
	i := l.info.Load()
	if i.ReadOnly {
		return fmt.Errorf("initiator: LUN %d: %w", i.Number, ErrReadOnly)
	}
	if n == 0 {
		return nil
	}
	if !l.noWSame.Load() {
		unmap := !noUnmap && i.WriteSameUnmap && i.ZeroesAfterUnmap
		err := l.writeSame(ctx, off, n, unmap)
		if !errors.Is(err, ErrNotSupported) {
			return err
		}
		l.noWSame.Store(true)
		l.s.log.Info("WRITE SAME refused; writing zeroes with WRITE(16)", zap.Uint64("lun", i.Number))
	}
	var j job
	l.rwJob(&j, "WRITE(16)", off, int(n))
	j.write, j.zero = true, true
	if int64(j.total) != n {
		return fmt.Errorf("initiator: LUN %d: write zeroes of %d bytes: %w", i.Number, n, ErrRange)
	}
	return l.s.run(ctx, &j)
}

func (l *LUN) writeSame(ctx context.Context, off, n int64, unmap bool) error {
	i := l.info.Load()
	lba, end := uint64(off)>>l.bsShift, uint64(off+n)>>l.bsShift
	maxBlocks := uint64(defaultMaxWriteSame)
	if i.MaxWriteSame > 0 {
		maxBlocks = min(i.MaxWriteSame, 0xffffffff)
	}
	for lba < end {
		cnt := min(end-lba, maxBlocks)
		var j job
		l.single(&j, "WRITE SAME(16)", dirOut)
		j.spec.cdbLen = len(scsi.AppendWriteSame16(j.spec.cdb[:0], lba, uint32(cnt), unmap, false))
		j.spec.n, j.spec.zero, j.spec.lba = l.blockSize, true, lba
		if err := l.s.run(ctx, &j); err != nil {
			return err
		}
		lba += cnt
	}
	return nil
}

// Command sends a SCSI command to the LUN with at most one data direction: dataIn receives
// data-in, dataOut is sent as data-out (pass nil for the unused one). It returns the bytes of
// data-in received. UNIT ATTENTION, BUSY and transport failures are retried as for the block API;
// other statuses come back as *SCSIError.
func (l *LUN) Command(ctx context.Context, cdb []byte, dataIn, dataOut []byte) (int, error) {
	i := l.info.Load()
	return l.s.command(ctx, i.Number, i.Address, cdb, dataIn, dataOut)
}

// Reset sends LOGICAL UNIT RESET; commands to the LUN that were in flight are re-issued.
func (l *LUN) Reset(ctx context.Context) error {
	i := l.info.Load()
	return l.s.resetLUN(i.Number, i.Address, nil, nil, 0)
}

// single prepares j for one command to the LUN; the caller encodes its CDB into j.spec.cdb.
func (l *LUN) single(j *job, op string, dir dataDir) {
	i := l.info.Load()
	*j = job{lun: i.Number, lunAddr: i.Address, op: op}
	j.spec = cmdSpec{op: op, lun: i.Number, lunAddr: i.Address, dir: dir}
}

// command runs one CDB (up to 16 bytes) with optional data.
func (s *Session) command(ctx context.Context, lun uint64, addr srp.LUN, cdb []byte, dataIn, dataOut []byte) (int, error) {
	if len(cdb) == 0 || len(cdb) > 16 {
		return 0, fmt.Errorf("initiator: CDB of %d bytes: want 1..16", len(cdb))
	}
	if dataIn != nil && dataOut != nil {
		return 0, errors.New("initiator: bidirectional commands are not supported")
	}
	j := job{lun: lun, lunAddr: addr, op: fmt.Sprintf("opcode 0x%02x", cdb[0])}
	j.spec = cmdSpec{op: j.op, lun: lun, lunAddr: addr, cdbLen: len(cdb)}
	copy(j.spec.cdb[:], cdb)
	switch {
	case len(dataIn) > 0:
		j.spec.dir, j.spec.buf, j.spec.n = dirIn, dataIn, len(dataIn)
	case len(dataOut) > 0:
		j.spec.dir, j.spec.buf, j.spec.n = dirOut, dataOut, len(dataOut)
	}
	err := s.run(ctx, &j)
	return j.xfer, err
}

// ---- discovery ----

// Rescan runs discovery again: REPORT LUNS, then INQUIRY (standard, VPD 0x80, 0x83, 0xB0, 0xB2),
// READ CAPACITY(16) and MODE SENSE for every direct-access logical unit. LUN objects of units
// still present are kept (their information updated).
func (s *Session) Rescan(ctx context.Context) error {
	addrs, err := s.reportLUNs(ctx)
	if err != nil {
		return err
	}
	s.lunMu.RLock()
	old := s.luns
	s.lunMu.RUnlock()
	var luns []*LUN
	for _, a := range addrs {
		info, err := s.probe(ctx, a)
		if err != nil {
			if errors.Is(err, errNotDisk) || errors.Is(err, ErrLUNData) {
				s.log.Info("skipping logical unit", zap.String("lun", scsi.LUNAddress(a).String()), zap.Error(err))
				continue
			}
			return err
		}
		var l *LUN
		for _, o := range old {
			// Kept (its Info refreshed) unless its block size changed: blockSize and bsShift
			// are read without a lock by the I/O in flight.
			if o.info.Load().Address == a && o.blockSize == info.BlockSize {
				l = o
				break
			}
		}
		if l == nil {
			l = &LUN{s: s, blockSize: info.BlockSize, bsShift: uint(log2(info.BlockSize))}
		}
		l.info.Store(info)
		luns = append(luns, l)
		s.log.Info("logical unit", zap.Uint64("lun", info.Number), zap.String("vendor", info.Vendor),
			zap.String("product", info.Product), zap.String("id", info.IDString()), zap.Int("block_size", info.BlockSize),
			zap.Uint64("blocks", info.Blocks), zap.Bool("read_only", info.ReadOnly), zap.Bool("unmap", info.UnmapSupported))
	}
	s.lunMu.Lock()
	s.luns = luns
	s.lunMu.Unlock()
	return nil
}

var errNotDisk = errors.New("not a connected direct-access block device")

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

func lunNumber(a srp.LUN) uint64 {
	if n, ok := scsi.LUNAddress(a).Number(); ok {
		return uint64(n)
	}
	return binary.BigEndian.Uint64(a[:])
}

// lunCmd runs one discovery command with data-in and returns the bytes received (what
// Session.command returns: never more than len(in)).
type lunCmd func(cdb []byte, in []byte) (int, error)

func (s *Session) reportLUNs(ctx context.Context) ([]srp.LUN, error) {
	return reportLUNs(func(cdb, in []byte) (int, error) { return s.command(ctx, 0, srp.LUN{}, cdb, in, nil) })
}

// reportLUNs asks for the LUN list, with a larger buffer when the first does not hold it (at
// most maxReportLUNsTries commands, up to maxReportLUNs entries).
func reportLUNs(cmd lunCmd) ([]srp.LUN, error) {
	size := 8 + 8*64
	for try := 1; ; try++ {
		buf := make([]byte, size)
		var cdb [12]byte
		n, err := cmd(scsi.AppendReportLUNs(cdb[:0], 0, uint32(size)), buf)
		if err != nil {
			return nil, err
		}
		listLen, luns, err := parseReportLUNs(buf[:n])
		if err != nil {
			return nil, err
		}
		if want := reportLUNsAlloc(listLen); want > size && try < maxReportLUNsTries {
			size = want
			continue
		}
		return luns, nil
	}
}

// probe learns what a logical unit is.
func (s *Session) probe(ctx context.Context, a srp.LUN) (*LUNInfo, error) {
	info := &LUNInfo{Number: lunNumber(a), Address: a}
	err := probeLUN(info, func(cdb, in []byte) (int, error) { return s.command(ctx, info.Number, a, cdb, in, nil) })
	if err != nil {
		return nil, err
	}
	return info, nil
}

// probeLUN fills info (Number and Address set) from INQUIRY (standard, VPD 0x00, 0x80, 0x83,
// 0xB0, 0xB2), READ CAPACITY(16) or (10) and MODE SENSE(10). A LUN that is not a direct-access
// block device fails with errNotDisk, one whose data is malformed or unusable with ErrLUNData.
func probeLUN(info *LUNInfo, cmd lunCmd) error {
	var cdb [16]byte // each command's CDB, encoded afresh: cmd does not keep it
	inq := make([]byte, 96)
	n, err := cmd(scsi.AppendInquiry(cdb[:0], false, 0, uint16(len(inq))), inq)
	if err != nil {
		return err
	}
	if err := parseStdInquiry(inq[:n], info); err != nil {
		return err
	}

	vpd := func(page byte, size int) []byte {
		b := make([]byte, size)
		n, err := cmd(scsi.AppendInquiry(cdb[:0], true, page, uint16(size)), b)
		if err != nil {
			return nil
		}
		return vpdPayload(page, b[:n])
	}
	supported := parseSupportedVPD(vpd(0x00, 255))
	if supported[0x80] {
		if p := vpd(0x80, 255); p != nil {
			info.Serial = trimASCII(p[4:])
		}
	}
	if supported[0x83] {
		if p := vpd(0x83, 1024); p != nil {
			info.ID, info.IDType = pickDesignator(p[4:])
		}
	}

	// Capacity: READ CAPACITY(16), or (10) if the LUN does not know it.
	rc := make([]byte, 32)
	n, err = cmd(scsi.AppendReadCapacity16(cdb[:0], uint32(len(rc))), rc)
	ok := false
	if err == nil {
		if ok, err = parseReadCap16(rc[:n], info); err != nil {
			return err
		}
	} else if !errors.Is(err, ErrIllegalRequest) {
		return err
	}
	if !ok {
		rc10 := make([]byte, 8)
		n, err := cmd(scsi.AppendReadCapacity10(cdb[:0]), rc10)
		if err != nil {
			return err
		}
		if err := parseReadCap10(rc10[:n], info); err != nil {
			return err
		}
	}

	if supported[0xb0] {
		parseBlockLimits(vpd(0xb0, 64), info)
	}
	if info.Provisioning && supported[0xb2] {
		parseLBP(vpd(0xb2, 64), info)
	}
	if info.UnmapSupported && info.MaxUnmapDescs == 0 {
		info.UnmapSupported = false // SBC: a zero count means UNMAP is not supported
	}

	// Write protection: the WP bit of the mode parameter header (MODE SENSE(10) of the caching
	// page's current values, without block descriptors).
	ms := make([]byte, 64)
	if n, err := cmd(scsi.AppendModeSense10(cdb[:0], true, false, 0, modePageCaching, 0, uint16(len(ms))), ms); err == nil {
		info.ReadOnly, _ = parseModeSenseWP(ms[:n])
	} else if !errors.Is(err, ErrIllegalRequest) {
		return err
	}
	return nil
}

// pickDesignator chooses the logical unit's designator from a VPD 0x83 descriptor list: NAA,
// then EUI-64, then T10 vendor ID, then SCSI name string (association: logical unit).
func pickDesignator(b []byte) ([]byte, string) {
	best, bestRank := []byte(nil), 0
	names := map[int]string{4: "naa", 3: "eui64", 2: "t10", 1: "name"}
	for len(b) >= 4 {
		l := int(b[3])
		if 4+l > len(b) {
			break
		}
		assoc := (b[1] >> 4) & 0x3
		typ := b[1] & 0x0f
		rank := 0
		if assoc == 0 {
			switch typ {
			case 3:
				rank = 4
			case 2:
				rank = 3
			case 1:
				rank = 2
			case 8:
				rank = 1
			}
		}
		if rank > bestRank {
			best, bestRank = append([]byte(nil), b[4:4+l]...), rank
		}
		b = b[4+l:]
	}
	return best, names[bestRank]
}
