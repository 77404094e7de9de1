package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Sentinel errors. Every *Error wraps exactly one of the first group, so callers can tell a typo
// (ErrUnknownField) from a bad value (ErrInvalid) with errors.Is on the error Parse, Load or
// Validate returns.
var (
	// ErrSyntax: the file is not well-formed YAML (or not a single YAML mapping).
	ErrSyntax = errors.New("syntax error")
	// ErrUnknownField: a key that is not part of the schema (strict decoding).
	ErrUnknownField = errors.New("unknown field")
	// ErrType: a value of the wrong YAML kind (a list where a mapping belongs, a word where a
	// number belongs...).
	ErrType = errors.New("wrong type")
	// ErrInvalid: a value of the right kind outside what the field accepts.
	ErrInvalid = errors.New("invalid value")
	// ErrMissing: a required field is absent.
	ErrMissing = errors.New("missing field")
	// ErrDuplicate: a key repeated in one mapping, or a name, LUN, initiator, path... that must
	// be unique and is not.
	ErrDuplicate = errors.New("duplicate")
	// ErrReference: a reference to something that is not defined (a transport name, a LUN id).
	ErrReference = errors.New("undefined reference")
	// ErrUnsupported: a feature this build does not have (the verbs transport without the
	// verbs build tag).
	ErrUnsupported = errors.New("unsupported")
)

// Errors of the mutation helpers (AddTarget, RemoveLUN, ...).
var (
	// ErrNotFound: the named target, LUN, ACL or session does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: an object with that name, id or initiator already exists.
	ErrExists = errors.New("already exists")
	// ErrInUse: the object is referenced by another (a LUN named by an ACL).
	ErrInUse = errors.New("in use")
)

// Error is one problem in a configuration, located by file, line and field path, e.g.
//
//	srpd.yaml:14: targets[0].luns[1].size: must be a multiple of the block size (4096)
//
// Line and Column are 1-based and zero when unknown (a Config built in code rather than
// parsed). Path uses the YAML key names, with [i] for list elements.
type Error struct {
	File   string
	Line   int
	Column int
	Path   string
	// Object is how an operator knows the object the problem is in (target "storage",
	// target "storage" LUN 3, session "backup"), empty when the problem is not inside a
	// named list element; Field is then the path inside that object. Error() shows these
	// rather than Path's list indices, which say little about an object not yet created
	// (one sent through the control API).
	Object string
	Field  string
	Msg    string
	Err    error // one of the sentinels above
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if loc := e.Location(); loc != "" {
		b.WriteString(loc)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Location is where the problem is, by object name where it has one:
// `target "storage" LUN 3: size`, else the field path `targets[0].luns[1].size`.
func (e *Error) Location() string {
	switch {
	case e.Object == "":
		return e.Path
	case e.Field == "":
		return e.Object
	}
	return e.Object + ": " + e.Field
}

func (e *Error) Unwrap() error { return e.Err }

// ErrorList is every problem found in one configuration, in file order. It is the error type
// Parse, Load and Validate return; its message has one line per problem.
type ErrorList []*Error

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap lets errors.Is and errors.As look at every problem.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// sorted orders the list by line (problems without a line last), keeping the discovery order
// of problems on one line.
func (l ErrorList) sorted() ErrorList {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Line, l[j].Line
		if a == 0 || b == 0 {
			return a != 0 && b == 0
		}
		return a < b
	})
	return l
}

// err returns nil for an empty list, so that `return l.err()` never yields a non-nil error
// interface holding an empty list.
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	return l.sorted()
}
