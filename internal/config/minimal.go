package config

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"
)

// MarshalMinimal encodes c as YAML holding only what differs from the defaults (and version,
// so that a later schema can tell the file's), so that a saved configuration does not freeze
// today's defaults. Parse(MarshalMinimal(c)) equals c for a valid c with its defaults applied.
func MarshalMinimal(c *Config) ([]byte, error) {
	n, err := minimalNode(c)
	if err != nil {
		return nil, err
	}
	return encodeNode(n)
}

// encodeNode writes a node tree (a document or its root) as YAML indented by two spaces.
func encodeNode(n *yaml.Node) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b.Bytes(), nil
}

// minimalNode is the mapping node of c (defaults applied, on a copy) without the fields whose
// value is what omitting them gives.
func minimalNode(c *Config) (*yaml.Node, error) {
	cp := c.Clone()
	cp.SetDefaults()
	var n yaml.Node
	if err := n.Encode(cp); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	root := reflect.ValueOf(cp)
	prune(&n, root.Elem(), root, func(v reflect.Value) reflect.Value { return v.Elem() })
	if len(cp.Transports) == 1 {
		// Targets and sessions default to the only transport (Config.SetDefaults).
		only := cp.Transports[0].Name
		for _, list := range []string{"targets", "sessions"} {
			if seq := mapValue(&n, list); seq != nil {
				for _, e := range seq.Content {
					if t := mapValue(e, "transport"); t != nil && t.Value == only {
						deleteKey(e, "transport")
					}
				}
			}
		}
	}
	if mapValue(&n, "version") == nil {
		n.Content = append([]*yaml.Node{strNode("version"), {Kind: yaml.ScalarNode, Tag: "!!int", Value: fmt.Sprint(cp.Version)}}, n.Content...)
	}
	return &n, nil
}

// defaulter is a configuration type that fills its omitted fields.
type defaulter interface{ SetDefaults() }

var defaulterType = reflect.TypeFor[defaulter]()

// prune deletes from the mapping n (the encoding of the struct v) the keys whose value equals
// what the field gets when it is omitted. root is a pointer to the closest enclosing value
// with a SetDefaults method (v's own, or an ancestor's: RBD's defaults are set by LUN), and
// at reaches v from root, so that a field can be zeroed in a copy of root and defaulted again.
func prune(n *yaml.Node, v, root reflect.Value, at func(reflect.Value) reflect.Value) {
	if n.Kind != yaml.MappingNode || v.Kind() != reflect.Struct {
		return
	}
	if v.CanAddr() && v.Addr().Type().Implements(defaulterType) && v.Type() != root.Type().Elem() {
		root, at = v.Addr(), func(r reflect.Value) reflect.Value { return r.Elem() }
	}
	for _, f := range fieldsOf(v.Type()) {
		child := mapValue(n, f.name)
		if child == nil {
			continue
		}
		fieldAt := func(r reflect.Value) reflect.Value { return at(r).Field(f.index) }
		if !identityFields[v.Type().Field(f.index).Name] && omittedIsSame(root, fieldAt) {
			deleteKey(n, f.name)
			continue
		}
		fv := v.Field(f.index)
		switch {
		case isRecord(fv.Type()):
			prune(child, fv, root, fieldAt)
		case fv.Kind() == reflect.Pointer && !fv.IsNil() && isRecord(fv.Type().Elem()):
			prune(child, fv.Elem(), root, func(r reflect.Value) reflect.Value { return fieldAt(r).Elem() })
		case fv.Kind() == reflect.Slice && isRecord(fv.Type().Elem()) && child.Kind == yaml.SequenceNode && len(child.Content) == fv.Len():
			for i := range fv.Len() {
				prune(child.Content[i], fv.Index(i), root, func(r reflect.Value) reflect.Value { return fieldAt(r).Index(i) })
			}
		}
	}
}

// identityFields name an object of a list (see listKey) and are written even at their zero
// value: "id: 0" says which LUN this is.
var identityFields = map[string]bool{"Name": true, "ID": true, "Initiator": true, "Socket": true, "LUN": true}

// omittedIsSame reports whether zeroing the field that at reaches in a copy of *root and
// applying root's defaults gives the field its current value back.
func omittedIsSame(root reflect.Value, at func(reflect.Value) reflect.Value) bool {
	cp := reflect.New(root.Type().Elem())
	copyValue(cp.Elem(), root.Elem())
	at(cp).SetZero()
	cp.Interface().(defaulter).SetDefaults()
	return reflect.DeepEqual(at(cp).Interface(), at(root).Interface())
}

var nodeUnmarshalerPtr = reflect.TypeFor[nodeUnmarshaler]()

// isRecord reports whether t is a struct written as a mapping of its fields (not a value type
// such as Timeout or InitiatorID that reads and writes itself as a scalar).
func isRecord(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(nodeUnmarshalerPtr)
}

// mapValue returns the value of key in the mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if i := keyIndex(n, key); i >= 0 {
		return n.Content[i+1]
	}
	return nil
}

// keyIndex returns the index in n.Content of the key node named key, or -1.
func keyIndex(n *yaml.Node, key string) int {
	if n == nil || n.Kind != yaml.MappingNode {
		return -1
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
			return i
		}
	}
	return -1
}

func deleteKey(n *yaml.Node, key string) {
	if i := keyIndex(n, key); i >= 0 {
		n.Content = slices.Delete(n.Content, i, i+2)
	}
}

func strNode(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
