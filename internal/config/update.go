package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Update returns the configuration file data rewritten to hold c, editing its YAML node tree
// rather than marshalling c afresh: what did not change keeps its text, comments, quoting,
// flow style and blank lines; a changed value is replaced in place (keeping the comments
// around it); what is new is written with only its non-default fields (MarshalMinimal), and
// what is gone is removed with its comments. Objects in lists are matched by name (targets,
// sessions, transports), ID (LUNs), initiator (ACLs) or socket (NBD exports), so reordering
// or editing one does not touch the others. When c equals what data holds, data is returned
// as it is. Empty data gives MarshalMinimal(c).
//
// The node API loses what it does not model: the indentation of changed blocks becomes two
// spaces, and a changed line's comment follows its value after one space. An alias whose
// target changes is replaced by the value (the anchor is left alone for its other users).
func Update(data []byte, c *Config) ([]byte, error) {
	want := c.Clone()
	want.SetDefaults()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, ErrorList{syntaxError("", err)}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || isNull(doc.Content[0]) {
		return MarshalMinimal(want)
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config: update: the file is not a mapping of sections: %w", ErrType)
	}
	have := &Config{}
	if _, errs := decodeInto("", data, have); len(errs) > 0 {
		return nil, fmt.Errorf("config: update: the file does not decode: %w", errs)
	}
	have.SetDefaults()
	if Equal(have, want) {
		return data, nil
	}
	minimal, err := minimalNode(want)
	if err != nil {
		return nil, err
	}
	reconcileStruct(root, reflect.ValueOf(have).Elem(), reflect.ValueOf(want).Elem(), minimal)
	out, err := encodeNode(&doc)
	if err != nil {
		return nil, err
	}
	out = restoreLayout(data, out)
	// The edited tree must say exactly c; if it does not (a shape this code does not know),
	// the minimal encoding does, without the comments.
	check := &Config{}
	if _, errs := decodeInto("", out, check); len(errs) == 0 {
		check.SetDefaults()
		if Equal(check, want) {
			return out, nil
		}
	}
	return MarshalMinimal(want)
}

// UpdateFile rewrites the configuration file at path to hold c (Update), atomically
// (AtomicWrite), keeping the file's mode and owner; a missing file is created with perm and
// the minimal encoding. An unchanged file is not written. It returns the bytes the file holds.
func UpdateFile(path string, c *Config, perm os.FileMode) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("config: %w", err)
	}
	out, err := Update(data, c)
	if err != nil {
		return nil, fmt.Errorf("config: update %s: %w", path, err)
	}
	if data != nil && bytes.Equal(out, data) {
		return out, nil
	}
	return out, AtomicWrite(path, out, perm)
}

// reconcileStruct edits the mapping m, which decoded to have, so that it decodes to want.
// minimal is want's minimal encoding (nil: every field is at its default).
func reconcileStruct(m *yaml.Node, have, want reflect.Value, minimal *yaml.Node) {
	fs := fieldsOf(want.Type())
	for fi, f := range fs {
		if reflect.DeepEqual(have.Field(f.index).Interface(), want.Field(f.index).Interface()) {
			continue
		}
		wantNode := mapValue(minimal, f.name)
		ki := keyIndex(m, f.name)
		switch {
		case wantNode == nil:
			deleteKey(m, f.name) // the new value is the default: say nothing
		case ki < 0:
			// Insert after the closest earlier field (in the struct's order) that the file
			// has, else before the first later one, else at the end.
			at := -1
			for k := fi - 1; k >= 0 && at < 0; k-- {
				if j := keyIndex(m, fs[k].name); j >= 0 {
					at = j + 2
				}
			}
			for k := fi + 1; k < len(fs) && at < 0; k++ {
				if j := keyIndex(m, fs[k].name); j >= 0 {
					at = j
				}
			}
			if at < 0 {
				at = len(m.Content)
			}
			m.Content = append(m.Content[:at], append([]*yaml.Node{strNode(f.name), wantNode}, m.Content[at:]...)...)
		default:
			reconcileValue(m.Content[ki+1], have.Field(f.index), want.Field(f.index), wantNode)
		}
	}
}

// reconcileValue edits n, which decoded to have, to hold want (minimal: its minimal encoding).
func reconcileValue(n *yaml.Node, have, want reflect.Value, minimal *yaml.Node) {
	t := want.Type()
	switch {
	case n.Kind == yaml.AliasNode:
		replaceNode(n, minimal)
	case isRecord(t) && n.Kind == yaml.MappingNode:
		reconcileStruct(n, have, want, minimal)
	case t.Kind() == reflect.Pointer && isRecord(t.Elem()) && !have.IsNil() && !want.IsNil() && n.Kind == yaml.MappingNode:
		reconcileStruct(n, have.Elem(), want.Elem(), minimal)
	case t.Kind() == reflect.Slice && isRecord(t.Elem()) && n.Kind == yaml.SequenceNode &&
		len(n.Content) == have.Len() && minimal.Kind == yaml.SequenceNode && len(minimal.Content) == want.Len():
		reconcileList(n, have, want, minimal)
	default:
		replaceNode(n, minimal)
	}
}

// reconcileList edits the sequence n to hold want's objects in want's order, keeping the
// nodes of the objects it already holds (matched by listKey).
func reconcileList(n *yaml.Node, have, want reflect.Value, minimal *yaml.Node) {
	idx := make(map[string]int, have.Len())
	for i := range have.Len() {
		idx[listKey(have.Index(i), i)] = i
	}
	content := make([]*yaml.Node, 0, want.Len())
	for i := range want.Len() {
		j, ok := idx[listKey(want.Index(i), i)]
		if !ok {
			content = append(content, minimal.Content[i])
			continue
		}
		node := n.Content[j]
		if !reflect.DeepEqual(have.Index(j).Interface(), want.Index(i).Interface()) {
			reconcileValue(node, have.Index(j), want.Index(i), minimal.Content[i])
		}
		content = append(content, node)
	}
	n.Content = content
}

// listKey identifies an object of a configuration list: its name, ID, initiator or socket;
// the position for a type without one.
func listKey(v reflect.Value, i int) string {
	for _, name := range []string{"Name", "ID", "Initiator", "Socket"} {
		if f := v.FieldByName(name); f.IsValid() {
			return fmt.Sprint(f.Interface())
		}
	}
	return fmt.Sprintf("#%d", i)
}

// replaceNode makes n the value of with, keeping n's comments, and the flow style of a
// list or mapping written inline ([a, b]).
func replaceNode(n, with *yaml.Node) {
	head, line, foot := n.HeadComment, n.LineComment, n.FootComment
	flow := n.Style&yaml.FlowStyle != 0 && n.Kind == with.Kind && n.Kind != yaml.ScalarNode
	*n = *with
	n.HeadComment, n.LineComment, n.FootComment = head, line, foot
	if flow {
		n.Style |= yaml.FlowStyle
	}
}

// maxLayoutLines bounds the files whose layout restoreLayout puts back (it compares every
// line with every line).
const maxLayoutLines = 4000

// restoreLayout puts back what re-encoding the node tree loses from orig: the blank lines,
// and the exact text (alignment of comments, indentation) of the lines that did not change.
// A line of out that matches a line of orig (the same once whitespace is collapsed, in a
// longest common subsequence of the two) is replaced by orig's line, and preceded by the
// blank lines that preceded it in orig.
func restoreLayout(orig, out []byte) []byte {
	a := strings.Split(strings.TrimSuffix(string(orig), "\n"), "\n")
	b := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(a) > maxLayoutLines || len(b) > maxLayoutLines {
		return out
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	na, nb := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		na[i] = norm(a[i])
	}
	for i := range b {
		nb[i] = norm(b[i])
	}
	// lcs[i][j]: the longest common subsequence of na[i:] and nb[j:], blank lines of a skipped.
	lcs := make([][]int32, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int32, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			switch {
			case na[i] != "" && na[i] == nb[j]:
				lcs[i][j] = lcs[i+1][j+1] + 1
			default:
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var res strings.Builder
	// pending: the blank lines to write before the next line, the longest run of blank lines
	// of orig since the last line written (a removed line between two runs does not add them).
	pending, run := 0, 0
	emit := func(line string) {
		res.WriteString(strings.Repeat("\n", pending) + line + "\n")
		pending, run = 0, 0
	}
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case na[i] != "" && na[i] == nb[j]:
			emit(a[i])
			i++
			j++
		case lcs[i][j+1] == lcs[i][j]:
			// A new line: written right after what precedes it, before orig's blank lines.
			emit(b[j])
			j++
		case na[i] == "":
			run++
			pending = max(pending, run)
			i++
		default:
			run = 0 // a line of orig that is gone
			i++
		}
	}
	for ; j < len(b); j++ {
		emit(b[j])
	}
	return []byte(res.String())
}
