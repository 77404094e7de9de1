package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// pos is a 1-based line and column in the source file.
type pos struct{ line, col int }

// source remembers where a Config came from, so that Validate can locate its errors.
type source struct {
	file string
	pos  map[string]pos  // field path → position of its key (or list element)
	bad  map[string]bool // paths that failed to decode: validation stays quiet about them
}

// maxNodes bounds the nodes visited while decoding, aliases expanded: a few anchors can
// otherwise make a small document expand exponentially.
const maxNodes = 1 << 20

// decoder turns a yaml.Node tree into Go values strictly: unknown keys, duplicate keys and
// values of the wrong kind are errors naming the field path and position; decoding goes on
// after an error so that one run reports every problem.
type decoder struct {
	src    *source
	errs   ErrorList
	budget int
}

func newDecoder(file string) *decoder {
	return &decoder{
		src:    &source{file: file, pos: map[string]pos{}, bad: map[string]bool{}},
		budget: maxNodes,
	}
}

func (d *decoder) fail(n *yaml.Node, path string, kind error, format string, args ...any) {
	d.errs = append(d.errs, &Error{
		File: d.src.file, Line: n.Line, Column: n.Column, Path: path,
		Msg: fmt.Sprintf(format, args...), Err: kind,
	})
	d.src.bad[path] = true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

var nodeUnmarshalerType = reflect.TypeFor[nodeUnmarshaler]()

// decode stores n into v (addressable), reporting problems under path.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if d.budget--; d.budget < 0 {
		if d.budget == -1 {
			d.fail(n, path, ErrSyntax, "document too large (more than %d values once aliases are expanded)", maxNodes)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.fail(n, path, ErrSyntax, "alias to an unknown anchor")
			return
		}
		n = n.Alias
	}
	if isNull(n) {
		return // leave the zero value: the default applies
	}
	if v.CanAddr() && v.Addr().Type().Implements(nodeUnmarshalerType) {
		if err := v.Addr().Interface().(nodeUnmarshaler).unmarshalNode(n); err != nil {
			d.fail(n, path, ErrInvalid, "%s", err.Error())
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		nv := reflect.New(v.Type().Elem())
		before := len(d.errs)
		d.decode(n, nv.Elem(), path)
		if len(d.errs) == before {
			v.Set(nv)
		}
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, ErrType, "must be a list, not %s", kindName(n))
			return
		}
		if len(n.Content) == 0 {
			return // an empty list is the same as none: nil, as SetDefaults makes it
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.src.pos[p] = pos{e.Line, e.Column}
			d.decode(e, s.Index(i), p)
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, ErrType, "must be a string, not %s", kindName(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, ErrType, "must be true or false, not %s", kindName(n))
			return
		}
		switch n.Value {
		case "true", "True", "TRUE":
			v.SetBool(true)
		case "false", "False", "FALSE":
			v.SetBool(false)
		default:
			d.fail(n, path, ErrType, "must be true or false, not %q", n.Value)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i, err := parseInt(n)
		if err == nil && v.OverflowInt(i) {
			err = fmt.Errorf("%s is out of range", n.Value)
		}
		if err != nil {
			d.fail(n, path, ErrType, "%s", err.Error())
			return
		}
		v.SetInt(i)
	default:
		panic(fmt.Sprintf("config: decoding into %v is not supported", v.Type()))
	}
}

// parseInt reads a YAML integer: decimal, or 0x/0o/0b prefixed, with optional _ separators.
func parseInt(n *yaml.Node) (int64, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("must be an integer, not %s", kindName(n))
	}
	s := strings.ReplaceAll(strings.TrimSpace(n.Value), "_", "")
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(strings.TrimPrefix(s, "-"), "+")
	base := 10
	if len(s) > 2 && s[0] == '0' {
		switch s[1] {
		case 'x', 'X':
			base, s = 16, s[2:]
		case 'o', 'O':
			base, s = 8, s[2:]
		case 'b', 'B':
			base, s = 2, s[2:]
		}
	}
	u, err := strconv.ParseUint(s, base, 63)
	if err != nil || s == "" {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("%s is out of range", n.Value)
		}
		return 0, fmt.Errorf("must be an integer, not %q", n.Value)
	}
	if neg {
		return -int64(u), nil
	}
	return int64(u), nil
}

// field is one decodable struct field.
type field struct {
	name  string
	index int
}

func fieldsOf(t reflect.Type) []field {
	var fs []field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		fs = append(fs, field{name, i})
	}
	return fs
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, ErrType, "must be a mapping, not %s", kindName(n))
		return
	}
	fs := fieldsOf(v.Type())
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			d.fail(k, path, ErrType, "keys must be strings, not %s", kindName(k))
			continue
		}
		p := k.Value
		if path != "" {
			p = path + "." + k.Value
		}
		if k.Value == "<<" {
			d.fail(k, p, ErrSyntax, "merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.fail(k, p, ErrDuplicate, "duplicate key (first at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		var f *field
		for j := range fs {
			if fs[j].name == k.Value {
				f = &fs[j]
				break
			}
		}
		if f == nil {
			d.fail(k, p, ErrUnknownField, "unknown field%s", suggest(k.Value, fs))
			continue
		}
		d.src.pos[p] = pos{k.Line, k.Column}
		d.decode(val, v.Field(f.index), p)
	}
}

// suggest returns ` (did you mean "x"?)` for the closest field name, or a list of the valid ones.
func suggest(key string, fs []field) string {
	best, bestD := "", 3
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
		norm := strings.NewReplacer("-", "_", " ", "_").Replace(strings.ToLower(key))
		if dist := editDistance(norm, f.name); dist < bestD {
			best, bestD = f.name, dist
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return " (valid: " + strings.Join(names, ", ") + ")"
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError converts a yaml.v3 parse error into an *Error with its line.
func syntaxError(file string, err error) *Error {
	msg := err.Error()
	e := &Error{File: file, Err: ErrSyntax}
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	e.Msg = "invalid YAML: " + msg
	return e
}

// parseDocument parses data as exactly one YAML document whose root is a mapping (or empty).
// It returns nil for an empty document.
func parseDocument(file string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, ErrorList{syntaxError(file, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, ErrorList{syntaxError(file, err)}
		}
		return nil, ErrorList{{File: file, Line: extra.Line, Err: ErrSyntax,
			Msg: "more than one YAML document (remove the second ---)"}}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, nil
		}
		root = root.Content[0]
	}
	if isNull(root) {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, ErrorList{{File: file, Line: root.Line, Column: root.Column, Err: ErrType,
			Msg: "the configuration must be a mapping of sections (transports:, targets:, ...), not " + kindName(root)}}
	}
	return root, nil
}

// decodeInto parses data strictly into v (a pointer to a struct), returning the source positions
// and the decoding problems.
func decodeInto(file string, data []byte, v any) (*source, ErrorList) {
	d := newDecoder(file)
	root, err := parseDocument(file, data)
	if err != nil {
		return d.src, err.(ErrorList)
	}
	if root != nil {
		d.decode(root, reflect.ValueOf(v).Elem(), "")
	}
	return d.src, d.errs
}
