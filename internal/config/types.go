package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/srpd/srpd/srp"
)

// nodeUnmarshaler is implemented by the value types that read themselves from a YAML node.
// The returned error's text becomes the message of an ErrInvalid *Error at the node.
type nodeUnmarshaler interface {
	unmarshalNode(n *yaml.Node) error
}

// scalar returns the text of a scalar node, or an error naming the node's kind.
func scalar(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("must be %s, not %s", what, kindName(n))
	}
	return strings.TrimSpace(n.Value), nil
}

// unmarshalJSONString decodes a JSON string (for types written as strings in JSON).
func unmarshalJSONString(data []byte, what string) (string, error) {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return "", fmt.Errorf("must be %s", what)
	}
	return strings.TrimSpace(s), nil
}

// ---------------------------------------------------------------------------------------------
// Size

// Size is a byte count. In YAML and JSON it is a whole number of bytes or a string with a unit:
// KiB, MiB, GiB, TiB, PiB (powers of 1024; K, M, G, T, P and Ki, Mi, ... mean the same), kB, MB,
// GB, TB, PB (powers of 1000) or B. Units are case-insensitive and may follow a space:
// "64MiB", "1 GiB", "4096", "1G". Marshalled as the largest binary unit that divides it exactly.
type Size int64

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	"p": 1 << 50, "pi": 1 << 50, "pib": 1 << 50, "pb": 1e15,
}

// ParseSize parses a size as described on Size.
func ParseSize(s string) (Size, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("invalid size %q: want a whole number of bytes or a number with a unit (64MiB, 1GiB)", s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	unit := strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, PiB, kB, MB, GB, TB or PB)", s, s[i:])
	}
	hi, lo := bits.Mul64(uint64(n), uint64(mult))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return Size(lo), nil
}

// String formats the size with the largest binary unit that divides it exactly ("64MiB"), or as
// a plain number of bytes.
func (s Size) String() string {
	if s > 0 {
		for _, u := range []struct {
			name  string
			shift uint
		}{{"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
			if s%(1<<u.shift) == 0 {
				return strconv.FormatInt(int64(s)>>u.shift, 10) + u.name
			}
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

func (s *Size) unmarshalNode(n *yaml.Node) error { return unmarshalScalar(n, "a size", ParseSize, s) }

// MarshalYAML writes "64MiB", or a plain integer when no binary unit divides the size.
func (s Size) MarshalYAML() (any, error) {
	if str := s.String(); strings.HasSuffix(str, "B") {
		return str, nil
	}
	return int64(s), nil
}

// MarshalJSON writes the number of bytes.
func (s Size) MarshalJSON() ([]byte, error) { return strconv.AppendInt(nil, int64(s), 10), nil }

// UnmarshalJSON accepts a number of bytes or a string with a unit.
func (s *Size) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		str, err := unmarshalJSONString(data, "a size")
		if err != nil {
			return err
		}
		*s, err = ParseSize(str)
		return err
	}
	var n int64
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("invalid size %s: want a whole number of bytes or a string like \"64MiB\"", data)
	}
	if n < 0 {
		return fmt.Errorf("invalid size %d: negative", n)
	}
	*s = Size(n)
	return nil
}

// ---------------------------------------------------------------------------------------------
// Duration

// Duration is a time.Duration written in Go syntax ("10s", "1m30s", "250ms"). Negative
// durations are refused.
type Duration time.Duration

// ParseDuration parses a non-negative Go duration.
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want Go syntax such as 10s, 1m30s or 250ms", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: negative", s)
	}
	return Duration(d), nil
}

func (d Duration) String() string { return time.Duration(d).String() }

func (d *Duration) unmarshalNode(n *yaml.Node) error {
	return unmarshalScalar(n, "a duration", ParseDuration, d)
}

func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

func (d *Duration) UnmarshalJSON(data []byte) error {
	s, err := unmarshalJSONString(data, "a duration string such as \"10s\"")
	if err != nil {
		return err
	}
	*d, err = ParseDuration(s)
	return err
}

// ---------------------------------------------------------------------------------------------
// Timeout

// Timeout is an initiator transport-layer timeout: a Go duration, or "off" (disabled), the way
// scsi_transport_srp takes reconnect_delay, fast_io_fail_tmo and dev_loss_tmo (where "off" is
// -1). The zero Timeout is a duration of 0.
type Timeout struct {
	off bool
	d   time.Duration
}

// TimeoutOf returns an enabled timeout of d.
func TimeoutOf(d time.Duration) *Timeout { return &Timeout{d: d} }

// TimeoutOff returns a disabled timeout.
func TimeoutOff() *Timeout { return &Timeout{off: true} }

// Off reports whether the timeout is disabled.
func (t Timeout) Off() bool { return t.off }

// Duration returns the timeout (0 when Off).
func (t Timeout) Duration() time.Duration {
	if t.off {
		return 0
	}
	return t.d
}

// String returns "off" or the Go duration.
func (t Timeout) String() string {
	if t.off {
		return "off"
	}
	return t.d.String()
}

// ParseTimeout parses "off" or a non-negative Go duration.
func ParseTimeout(s string) (*Timeout, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "off") {
		return TimeoutOff(), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("invalid timeout %q: want off or a Go duration such as 15s", s)
	}
	if d < 0 {
		return nil, fmt.Errorf("invalid timeout %q: negative (use off to disable)", s)
	}
	return TimeoutOf(d), nil
}

func (t *Timeout) unmarshalNode(n *yaml.Node) error {
	v, err := scalar(n, "a timeout")
	if err != nil {
		return err
	}
	if n.Tag == "!!bool" && (v == "false" || v == "False" || v == "FALSE") {
		v = "off" // `dev_loss_tmo: false` reads naturally as off; YAML 1.1's `off` is a string in 1.2
	}
	p, err := ParseTimeout(v)
	if err != nil {
		return err
	}
	*t = *p
	return nil
}

func (t Timeout) MarshalYAML() (any, error)    { return t.String(), nil }
func (t Timeout) MarshalJSON() ([]byte, error) { return json.Marshal(t.String()) }
func (t *Timeout) UnmarshalJSON(data []byte) error {
	s, err := unmarshalJSONString(data, `"off" or a duration string such as "15s"`)
	if err != nil {
		return err
	}
	p, err := ParseTimeout(s)
	if err != nil {
		return err
	}
	*t = *p
	return nil
}

// ---------------------------------------------------------------------------------------------
// PortID

// PortID is a 16-byte SRP port identifier: bytes 0-7 the identifier extension (id_ext, or an
// initiator's initiator_ext), bytes 8-15 the GUID (ioc_guid, or the initiator port's interface
// ID). In YAML it is 32 hexadecimal digits with an optional 0x prefix (colons are ignored), or a
// mapping {id_ext: <hex u64>, ioc_guid: <hex u64>}. It is always written as "0x" + 32 digits.
type PortID srp.PortID

// ParsePortID parses 32 hexadecimal digits (optional 0x, colons ignored).
func ParsePortID(s string) (PortID, error) {
	p, err := srp.ParsePortID(strings.TrimSpace(s))
	if err != nil {
		return PortID{}, fmt.Errorf("invalid port id %q: want 32 hexadecimal digits, id_ext then ioc_guid (e.g. 0x0002c903000f12340002c903000f1234)", s)
	}
	return PortID(p), nil
}

// MakePortID builds a port ID from its two halves.
func MakePortID(idExt, guid uint64) PortID { return PortID(srp.MakePortID(idExt, guid)) }

func (p PortID) String() string               { return srp.PortID(p).String() }
func (p PortID) IsZero() bool                 { return p == PortID{} }
func (p PortID) SRP() srp.PortID              { return srp.PortID(p) }
func (p PortID) IDExt() uint64                { return srp.PortID(p).IDExt() }
func (p PortID) GUID() uint64                 { return srp.PortID(p).GUID() }
func (p PortID) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *PortID) UnmarshalText(b []byte) error { return unmarshalText(b, ParsePortID, p) }

func (p PortID) MarshalYAML() (any, error) { return p.String(), nil }

func (p *PortID) unmarshalNode(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var idExt, guid ID64
		var seen [2]bool
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			var dst *ID64
			switch k {
			case "id_ext":
				dst, seen[0] = &idExt, true
			case "ioc_guid":
				dst, seen[1] = &guid, true
			default:
				return fmt.Errorf("unknown key %q in port id (want id_ext and ioc_guid)", k)
			}
			if err := dst.unmarshalNode(v); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		if !seen[0] || !seen[1] {
			return errors.New("a port id mapping needs both id_ext and ioc_guid")
		}
		*p = MakePortID(uint64(idExt), uint64(guid))
		return nil
	}
	v, err := scalar(n, "a port id (32 hexadecimal digits)")
	if err != nil {
		return err
	}
	*p, err = ParsePortID(v)
	return err
}

// ---------------------------------------------------------------------------------------------
// ID64

// ID64 is a 64-bit identifier written in hexadecimal, with or without 0x: always hexadecimal,
// as ib_srp's add_target parses id_ext, ioc_guid and initiator_ext (so "10" is 16). Written as
// "0x" + 16 digits.
type ID64 uint64

// ParseID64 parses up to 16 hexadecimal digits with an optional 0x prefix.
func ParseID64(s string) (ID64, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "0x"), "0X")
	if t == "" || len(t) > 16 {
		return 0, fmt.Errorf("invalid identifier %q: want 1 to 16 hexadecimal digits", s)
	}
	v, err := strconv.ParseUint(t, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid identifier %q: want 1 to 16 hexadecimal digits", s)
	}
	return ID64(v), nil
}

func (x ID64) String() string { return fmt.Sprintf("0x%016x", uint64(x)) }

func (x *ID64) unmarshalNode(n *yaml.Node) error {
	return unmarshalScalar(n, "a hexadecimal identifier", ParseID64, x)
}

func (x ID64) MarshalYAML() (any, error)     { return x.String(), nil }
func (x ID64) MarshalText() ([]byte, error)  { return []byte(x.String()), nil }
func (x *ID64) UnmarshalText(b []byte) error { return unmarshalText(b, ParseID64, x) }

// ---------------------------------------------------------------------------------------------
// FileMode

// FileMode is a permission mode written in octal: "0660", "660" or "0o660". Written as "0660".
type FileMode uint32

// ParseFileMode parses an octal mode up to 0777.
func ParseFileMode(s string) (FileMode, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimPrefix(strings.TrimPrefix(t, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || t == "" || v > 0o777 {
		return 0, fmt.Errorf("invalid mode %q: want octal permission bits up to 0777, e.g. \"0660\"", s)
	}
	return FileMode(v), nil
}

func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

func (m *FileMode) unmarshalNode(n *yaml.Node) error {
	return unmarshalScalar(n, "an octal mode", ParseFileMode, m)
}

func (m FileMode) MarshalYAML() (any, error)     { return m.String(), nil }
func (m FileMode) MarshalText() ([]byte, error)  { return []byte(m.String()), nil }
func (m *FileMode) UnmarshalText(b []byte) error { return unmarshalText(b, ParseFileMode, m) }

// ---------------------------------------------------------------------------------------------
// InitiatorID

// InitiatorID names the initiator an ACL applies to: a 16-byte initiator port ID
// (initiator_ext then the port GUID), or "*" for any initiator no other ACL of the target names.
type InitiatorID struct {
	Any bool
	ID  PortID
}

// AnyInitiator is the "*" ACL initiator.
var AnyInitiator = InitiatorID{Any: true}

// ParseInitiatorID parses "*" or a port ID.
func ParseInitiatorID(s string) (InitiatorID, error) {
	if strings.TrimSpace(s) == "*" {
		return AnyInitiator, nil
	}
	p, err := ParsePortID(s)
	if err != nil {
		return InitiatorID{}, fmt.Errorf("invalid initiator %q: want \"*\" or an initiator port id of 32 hexadecimal digits", s)
	}
	return InitiatorID{ID: p}, nil
}

// String returns "*" or the port ID in canonical form.
func (i InitiatorID) String() string {
	if i.Any {
		return "*"
	}
	return i.ID.String()
}

// IsZero reports whether neither Any nor an ID is set.
func (i InitiatorID) IsZero() bool { return !i.Any && i.ID.IsZero() }

// Matches reports whether the ACL entry names port p exactly (not through "*").
func (i InitiatorID) Matches(p PortID) bool { return !i.Any && i.ID == p }

func (i *InitiatorID) unmarshalNode(n *yaml.Node) error {
	return unmarshalScalar(n, `"*" or an initiator port id`, ParseInitiatorID, i)
}

func (i InitiatorID) MarshalYAML() (any, error)     { return i.String(), nil }
func (i InitiatorID) MarshalText() ([]byte, error)  { return []byte(i.String()), nil }
func (i *InitiatorID) UnmarshalText(b []byte) error { return unmarshalText(b, ParseInitiatorID, i) }

// unmarshalScalar sets *dst to what parse makes of the YAML scalar n (what names the kind of
// value the error asks for).
func unmarshalScalar[T any](n *yaml.Node, what string, parse func(string) (T, error), dst *T) error {
	v, err := scalar(n, what)
	if err != nil {
		return err
	}
	*dst, err = parse(v)
	return err
}

// unmarshalText sets *dst to what parse makes of b, and leaves it alone when b does not parse.
func unmarshalText[T any](b []byte, parse func(string) (T, error), dst *T) error {
	v, err := parse(string(b))
	if err != nil {
		return err
	}
	*dst = v
	return nil
}
