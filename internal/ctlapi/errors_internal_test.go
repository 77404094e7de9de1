package ctlapi

import (
	"errors"
	"fmt"
	"testing"

	"github.com/srpd/srpd/internal/config"
)

// TestErrorInfoConflicts checks that every way a conflict reaches the server (a sentinel, a
// config mutation error, a validated configuration whose only problems are duplicates of
// running objects) answers conflict or already_exists, which srpctl maps to exit 6, and that a
// request invalid on its own stays invalid_argument.
func TestErrorInfoConflicts(t *testing.T) {
	dup := config.ErrorList{{Path: "targets[1].port_id", Object: `target "b"`, Field: "port_id", Msg: "port id 1:1 is already used by target \"a\"", Err: config.ErrDuplicate}}
	mixed := config.ErrorList{dup[0], {Path: "targets[1].cm_port", Msg: "0 is out of range", Err: config.ErrInvalid}}
	for _, tt := range []struct {
		name string
		err  error
		want Code
	}{
		{"sentinel", fmt.Errorf("target busy: %w", ErrConflict), CodeConflict},
		{"config in use", fmt.Errorf("LUN 0 listed: %w", config.ErrInUse), CodeConflict},
		{"config exists", fmt.Errorf("target %q: %w", "a", config.ErrExists), CodeAlreadyExists},
		{"duplicates only", dup, CodeConflict},
		{"duplicates wrapped", fmt.Errorf("applying: %w", dup), CodeConflict},
		{"duplicates and a conflict", errors.Join(mixed, ErrConflict), CodeConflict},
		{"duplicate and invalid", mixed, CodeInvalidArgument},
		{"request invalid on its own", validationError("target", dup), CodeInvalidArgument},
		{"plain", errors.New("boom"), CodeInternal},
	} {
		if got := errorInfo(tt.err).Code; got != tt.want {
			t.Errorf("%s: errorInfo(%v).Code = %s, want %s", tt.name, tt.err, got, tt.want)
		}
	}
	// The location by name reaches the client.
	if d := errorInfo(dup).Details; len(d) != 1 || d[0].Location != `target "b": port_id` || d[0].Path != "targets[1].port_id" {
		t.Errorf("details %+v", d)
	}
}
