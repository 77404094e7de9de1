package scsi

import (
	"bytes"
	"errors"
	"testing"
)

// Target ports of the ALUA tests: nexA and nexB come through port {0x1} (relative port 1, group
// 1); nexP2 through port {0x2} (relative port 2, group 2); nexStray through a port the LUN's
// ALUA configuration does not list.
var (
	nexP2    = Nexus{InitiatorPortID: [16]byte{0xD}, TargetPortID: [16]byte{0x2}}
	nexStray = Nexus{InitiatorPortID: [16]byte{0xE}, TargetPortID: [16]byte{0x9}}
)

// testALUA is a LUN's ALUA configuration: group 1 (state g1, relative port 1, local port {0x1}),
// group 2 (active/non-optimized, preferred, relative ports 2 and 3; port 2 local as {0x2}) and
// group 7 (standby, relative port 9: another gateway's).
func testALUA(g1 ALUAState) *ALUAConfig {
	return &ALUAConfig{
		Groups: []PortGroup{
			{ID: 1, State: g1, RelativePorts: []uint16{1}},
			{ID: 2, State: ALUAActiveNonOptimized, Preferred: true, RelativePorts: []uint16{2, 3}},
			{ID: 7, State: ALUAStandby, RelativePorts: []uint16{9}},
		},
		Ports: []TargetPort{{ID: [16]byte{0x1}, RelativeID: 1}, {ID: [16]byte{0x2}, RelativeID: 2}},
	}
}

func withALUA(s ALUAState) func(*LUNConfig) {
	return func(c *LUNConfig) { c.ALUA = testALUA(s) }
}

// cdbRTPG is REPORT TARGET PORT GROUPS (spc4r37 6.36): MAINTENANCE IN, PARAMETER DATA FORMAT in
// byte 1 bits 7:5 (001b: extended header), allocation length in bytes 6-9.
func cdbRTPG(ext bool, alloc uint32) []byte {
	c := []byte{OpMaintenanceIn, SAReportTargetPortGrps, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if ext {
		c[1] |= 0x20
	}
	c[6], c[7], c[8], c[9] = byte(alloc>>24), byte(alloc>>16), byte(alloc>>8), byte(alloc)
	return c
}

// rtpgGroups is the descriptor list of testALUA(ActiveOptimized), byte for byte (spc4r37
// Table 196): state (PREF 0x80), supported states 0x8F, group, reserved, status, vendor,
// port count, then per port 2 obsolete bytes and the relative port identifier.
var rtpgGroups = []byte{
	0x00, 0x8F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1,
	0x81, 0x8F, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3,
	0x02, 0x8F, 0, 7, 0, 0, 0, 1, 0, 0, 0, 9,
}

func TestReportTargetPortGroups(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "length only header", cfg: withALUA(ALUAActiveOptimized), cdb: cdbRTPG(false, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				want := append([]byte{0, 0, 0, byte(len(rtpgGroups))}, rtpgGroups...)
				if !bytes.Equal(d, want) {
					t.Fatalf("\n got % x\nwant % x", d, want)
				}
			}},
		{name: "extended header", cfg: withALUA(ALUAActiveOptimized), cdb: cdbRTPG(true, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				// RETURN DATA LENGTH is n-3: the 4 further header bytes and the descriptors.
				want := append([]byte{0, 0, 0, byte(4 + len(rtpgGroups)), 0x10, 0, 0, 0}, rtpgGroups...)
				if !bytes.Equal(d, want) {
					t.Fatalf("\n got % x\nwant % x", d, want)
				}
			}},
		{name: "truncated keeps the full length", cfg: withALUA(ALUAActiveOptimized), cdb: cdbRTPG(false, 6), in: 255,
			want: good(), check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0, 0, byte(len(rtpgGroups)), 0x00, 0x8F}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "state change sets the implicit status", cfg: withALUA(ALUAActiveOptimized),
			setup: func(t *testing.T, l *LUN, _ *memBackend) {
				if err := l.SetALUAState(1, ALUATransitioning); err != nil {
					t.Fatal(err)
				}
				wantSense(t, mustDo(l, nexA, cdbTUR()), UnitAttention, 0x2A, 0x06)
			},
			cdb: cdbRTPG(false, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[4] != 0x0F || d[9] != aluaStatusImplicit || d[16] != 0x81 || d[21] != 0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "reserved format", cfg: withALUA(ALUAActiveOptimized),
			cdb: func() []byte { c := cdbRTPG(false, 255); c[1] |= 0x40; return c }(), want: badCDB(1, 7)},
		{name: "without ALUA", cdb: cdbRTPG(false, 255), want: badCDB(1, 4)},
	})
}

func mustDo(l *LUN, n Nexus, cdb []byte) Result {
	r, _ := do(l, n, cdb, nil, 255)
	return r
}

func TestALUAInquiry(t *testing.T) {
	naa := [16]byte{0x60, 0x01, 0x40, 0x5A, 0xBC, 0xDE, 0xF0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	l, _ := newTestLUN(t, LUNConfig{Serial: "S1", NAA: naa, ALUA: testALUA(ALUAActiveOptimized)})
	clearUA(t, l, nexP2)
	r, d := do(l, nexA, cdbInquiry(false, 0, 96), nil, 96)
	wantGood(t, r)
	if d[5] != 0x10 { // TPGS 01b
		t.Fatalf("byte 5 %#x", d[5])
	}
	plain, _ := newTestLUN(t, testConfig())
	if _, d := do(plain, nexA, cdbInquiry(false, 0, 96), nil, 96); d[5] != 0 {
		t.Fatalf("TPGS without ALUA: byte 5 %#x", d[5])
	}

	// VPD 0x83: the NAA from the configuration, the T10 vendor ID, then (spc4r37 7.8.6.7,
	// 7.8.6.8) the relative target port and target port group of the port asked through:
	// protocol identifier SRP (4h) with code set binary, PIV, association target port.
	t10 := []byte{0x02, 0x01, 0, 10, 'S', 'R', 'P', 'D', ' ', ' ', ' ', ' ', 'S', '1'}
	for _, c := range []struct {
		nx    Nexus
		ports []byte
	}{
		{nexA, []byte{0x41, 0x94, 0, 4, 0, 0, 0, 1, 0x41, 0x95, 0, 4, 0, 0, 0, 1}},
		{nexP2, []byte{0x41, 0x94, 0, 4, 0, 0, 0, 2, 0x41, 0x95, 0, 4, 0, 0, 0, 2}},
		{nexStray, nil},
	} {
		if c.nx == nexStray {
			clearUA(t, l, nexStray)
		}
		r, d := do(l, c.nx, cdbInquiry(true, 0x83, 255), nil, 255)
		wantGood(t, r)
		want := []byte{0, 0x83, 0, 0, 0x01, 0x03, 0, 16}
		want = append(want, naa[:]...)
		want = append(want, t10...)
		want = append(want, c.ports...)
		want[3] = byte(len(want) - 4)
		if !bytes.Equal(d, want) {
			t.Fatalf("%x:\n got % x\nwant % x", c.nx.TargetPortID[0], d, want)
		}
	}
	if l.NAA() != naa {
		t.Fatal("NAA() is not the configured one")
	}
}

// TestALUAStates runs commands through a port in each refusing state: the ones SPC-4 (as LIO
// implements it) allows answer, the others get NOT READY with the state's ASCQ. A port in
// another group, or not in the configuration, is not affected.
func TestALUAStates(t *testing.T) {
	ok := good()
	type row struct {
		name                            string
		cdb                             []byte
		standby, unavailable, transient want
	}
	sb, un, tr := sk(NotReady, 0x04, 0x0B), sk(NotReady, 0x04, 0x0C), sk(NotReady, 0x04, 0x0A)
	rows := []row{
		{"TEST UNIT READY", cdbTUR(), sb, un, tr},
		{"READ(16)", cdbRead16(0, 1), sb, un, tr},
		{"WRITE(16)", cdbWrite16(0, 1), sb, un, tr},
		{"SYNCHRONIZE CACHE(16)", cdbSync16(0, 0), sb, un, tr},
		{"INQUIRY", cdbInquiry(false, 0, 96), ok, ok, ok},
		{"INQUIRY VPD 83", cdbInquiry(true, 0x83, 255), ok, ok, ok},
		{"REPORT LUNS", cdbReportLUNs(0, 64), ok, ok, ok},
		{"REQUEST SENSE", cdbRequestSense(false, 252), ok, ok, ok},
		{"REPORT TARGET PORT GROUPS", cdbRTPG(false, 255), ok, ok, ok},
		{"MODE SENSE(6)", cdbModeSense6(false, 0, 0x3F, 0, 255), ok, un, tr},
		{"READ CAPACITY(10)", cdbReadCap10(), ok, un, tr},
		{"READ CAPACITY(16)", cdbReadCap16(32), ok, un, tr},
		{"GET LBA STATUS", cdbGetLBAStatus(0, 64), sb, un, tr},
		{"PERSISTENT RESERVE IN", cdbPRIn(PRInReadKeys, 255), ok, un, tr},
		{"LOG SENSE", cdbLogSense(1, 0, 0, 0, 255), ok, un, tr},
		{"REPORT SUPPORTED OPERATION CODES", cdbRSOC(false, 1, OpRead16, 0, 64), ok, un, tr},
		{"unsupported opcode", []byte{0x1D, 0, 0, 0, 0, 0}, sb, un, tr},
		{"invalid INQUIRY still judged", cdbInquiry(true, 0x99, 255), badCDB(2, 7), badCDB(2, 7), badCDB(2, 7)},
	}
	for _, st := range []ALUAState{ALUAStandby, ALUAUnavailable, ALUATransitioning} {
		for _, c := range rows {
			t.Run(st.String()+"/"+c.name, func(t *testing.T) {
				cfg := testConfig()
				cfg.ALUA = testALUA(ALUAActiveOptimized)
				l, _ := newTestLUN(t, cfg)
				clearUA(t, l, nexP2)
				clearUA(t, l, nexStray)
				if err := l.SetALUAState(1, st); err != nil {
					t.Fatal(err)
				}
				wantSense(t, mustDo(l, nexA, cdbTUR()), UnitAttention, 0x2A, 0x06)
				r, d := do(l, nexA, c.cdb, make([]byte, 512), 255)
				w := map[ALUAState]want{ALUAStandby: c.standby, ALUAUnavailable: c.unavailable, ALUATransitioning: c.transient}[st]
				w.verify(t, r)
				if c.cdb[0] == OpRequestSense {
					s, _ := ParseSense(d)
					if !s.Match(NotReady, 0x04, aluaSense(st).ASCQ) {
						t.Fatalf("REQUEST SENSE data %v", s)
					}
				}
				// The port of group 2 (active/non-optimized) and a port outside the
				// configuration run the same command.
				for _, n := range []Nexus{nexP2, nexStray} {
					if r, _ := do(l, n, c.cdb, make([]byte, 512), 255); r.Status == StatusCheckCondition && r.Sense.Key == NotReady {
						t.Fatalf("through port %x: %v", n.TargetPortID[0], r.Sense)
					}
				}
			})
		}
	}
}

// TestALUAStateChange checks SetALUAState: the unit attention goes to the nexuses of the
// changed group's ports, once; the state takes effect at once, both ways.
func TestALUAStateChange(t *testing.T) {
	cfg := testConfig()
	cfg.ALUA = testALUA(ALUAActiveOptimized)
	l, _ := newTestLUN(t, cfg)
	clearUA(t, l, nexP2)
	clearUA(t, l, nexStray)

	if err := l.SetALUAState(1, ALUAStandby); err != nil {
		t.Fatal(err)
	}
	for _, n := range []Nexus{nexA, nexB} {
		wantSense(t, mustDo(l, n, cdbRead16(0, 1)), UnitAttention, 0x2A, 0x06)
		wantSense(t, mustDo(l, n, cdbRead16(0, 1)), NotReady, 0x04, 0x0B)
	}
	for _, n := range []Nexus{nexP2, nexStray} {
		wantGood(t, mustDo(l, n, cdbRead16(0, 1)))
	}
	// The same state again: nothing to report.
	if err := l.SetALUAState(1, ALUAStandby); err != nil {
		t.Fatal(err)
	}
	wantSense(t, mustDo(l, nexA, cdbTUR()), NotReady, 0x04, 0x0B)

	if err := l.SetALUAState(1, ALUAActiveOptimized); err != nil {
		t.Fatal(err)
	}
	wantSense(t, mustDo(l, nexA, cdbTUR()), UnitAttention, 0x2A, 0x06)
	wantGood(t, mustDo(l, nexA, cdbTUR()))

	// Group 2 has port 2 here: its nexus is told, group 1's are not.
	if err := l.SetALUAState(2, ALUAUnavailable); err != nil {
		t.Fatal(err)
	}
	wantGood(t, mustDo(l, nexA, cdbTUR()))
	wantSense(t, mustDo(l, nexP2, cdbTUR()), UnitAttention, 0x2A, 0x06)
	wantSense(t, mustDo(l, nexP2, cdbTUR()), NotReady, 0x04, 0x0C)

	// Group 7 is another gateway's: RTPG shows the change, no local nexus hears of it.
	if err := l.SetALUAState(7, ALUAActiveOptimized); err != nil {
		t.Fatal(err)
	}
	wantGood(t, mustDo(l, nexA, cdbTUR()))
	if gs := l.ALUAStates(); len(gs) != 3 || gs[0].State != ALUAActiveOptimized || gs[1].State != ALUAUnavailable ||
		gs[2].State != ALUAActiveOptimized || gs[2].ID != 7 || !gs[1].Preferred || len(gs[1].RelativePorts) != 2 {
		t.Fatalf("%+v", gs)
	}

	if err := l.SetALUAState(3, ALUAStandby); !errors.Is(err, ErrUnknownPortGroup) {
		t.Fatalf("unknown group: %v", err)
	}
	if err := l.SetALUAState(1, ALUAState(4)); !errors.Is(err, ErrUnknownALUAState) {
		t.Fatalf("LBA dependent: %v", err)
	}
	plain, _ := newTestLUN(t, testConfig())
	if err := plain.SetALUAState(1, ALUAStandby); !errors.Is(err, ErrUnknownPortGroup) || plain.ALUAStates() != nil {
		t.Fatalf("without ALUA: %v", err)
	}
}

func TestALUAConfigErrors(t *testing.T) {
	g := func(id uint16, ports ...uint16) PortGroup { return PortGroup{ID: id, RelativePorts: ports} }
	for _, c := range []struct {
		name string
		cfg  ALUAConfig
	}{
		{"no groups", ALUAConfig{}},
		{"duplicate group", ALUAConfig{Groups: []PortGroup{g(1, 1), g(1, 2)}}},
		{"relative port 0", ALUAConfig{Groups: []PortGroup{g(1, 0)}}},
		{"relative port in two groups", ALUAConfig{Groups: []PortGroup{g(1, 5), g(2, 5)}}},
		{"bad state", ALUAConfig{Groups: []PortGroup{{ID: 1, State: 0xE, RelativePorts: []uint16{1}}}}},
		{"local port in no group", ALUAConfig{Groups: []PortGroup{g(1, 1)}, Ports: []TargetPort{{RelativeID: 2}}}},
		{"local port twice", ALUAConfig{Groups: []PortGroup{g(1, 1, 2)},
			Ports: []TargetPort{{RelativeID: 1}, {RelativeID: 2}}}},
	} {
		cfg := testConfig()
		cfg.ALUA = &c.cfg
		if _, err := NewLUN(cfg, newMemBackend(512*testBlocks)); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	cfg := testConfig()
	cfg.NAA = [16]byte{0x50}
	if _, err := NewLUN(cfg, newMemBackend(512*testBlocks)); err == nil {
		t.Error("NAA 5 in a 16-byte designator accepted")
	}
}

func TestParseALUAState(t *testing.T) {
	for _, s := range []ALUAState{ALUAActiveOptimized, ALUAActiveNonOptimized, ALUAStandby, ALUAUnavailable, ALUATransitioning} {
		got, err := ParseALUAState(s.String())
		if err != nil || got != s {
			t.Errorf("%v: %v %v", s, got, err)
		}
	}
	if _, err := ParseALUAState("offline"); !errors.Is(err, ErrUnknownALUAState) {
		t.Fatal(err)
	}
}
