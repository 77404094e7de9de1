package ctlapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/ctlapi/ctlapitest"
)

// baseConfig is the daemon configuration the handler tests start from.
const baseConfig = ctlapitest.DemoConfig

func newFake(t *testing.T) *ctlapitest.Fake {
	t.Helper()
	c, err := config.Parse("base.yaml", []byte(baseConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := ctlapitest.NewFake(c)
	f.AddSession(ctlapi.SessionInfo{ID: "s1", Target: "demo", Initiator: config.MakePortID(0, 9), Channels: 2, State: ctlapi.StateLoggedIn})
	return f
}

// TestRoutes sends raw requests and checks the status, the error code and a piece of the body.
func TestRoutes(t *testing.T) {
	tests := []struct {
		name, method, path, body, ctype string
		status                          int
		code                            ctlapi.Code
		contains                        string
	}{
		{"status", "GET", "/v1/status", "", "", 200, "", `"api_version": 1`},
		{"list targets", "GET", "/v1/targets", "", "", 200, "", `"name": "demo"`},
		{"show target", "GET", "/v1/targets/demo", "", "", 200, "", `"listen": [`},
		{"show missing target", "GET", "/v1/targets/nope", "", "", 404, ctlapi.CodeNotFound, `target \"nope\": not found`},
		{"bad target name", "GET", "/v1/targets/-x", "", "", 400, ctlapi.CodeInvalidArgument, "names are"},
		{"create target", "POST", "/v1/targets", `{"name":"t2","port_id":"0x00000000000000010000000000000002"}`, "application/json", 201, "", `"127.0.0.1:5555"`},
		{"create existing target", "POST", "/v1/targets", `{"name":"demo","port_id":"0x00000000000000010000000000000002"}`, "", 409, ctlapi.CodeAlreadyExists, "already exists"},
		{"create target unknown field", "POST", "/v1/targets", `{"name":"t3","port_id":"0x00000000000000010000000000000002","colour":1}`, "", 400, ctlapi.CodeInvalidArgument, `unknown field \"colour\"`},
		{"create target invalid", "POST", "/v1/targets", `{"name":"t3","port_id":"0x00000000000000010000000000000002","luns":[{"id":1,"backend":"ram","size":1000}]}`, "", 400, ctlapi.CodeInvalidArgument, `"path": "luns[0].size"`},
		{"create target bad transport", "POST", "/v1/targets", `{"name":"t3","transport":"eth7","port_id":"0x00000000000000010000000000000003"}`, "", 400, ctlapi.CodeInvalidArgument, `transport \"eth7\" is not defined`},
		{"create target no body", "POST", "/v1/targets", "", "", 400, ctlapi.CodeInvalidArgument, "request body required"},
		{"create target trailing", "POST", "/v1/targets", `{"name":"t4","port_id":"0x00000000000000010000000000000004"} {}`, "", 400, ctlapi.CodeInvalidArgument, "data after the JSON value"},
		{"create target wrong type", "POST", "/v1/targets", `{"name":"t4","port_id":"0x00000000000000010000000000000004"}`, "text/plain", 415, ctlapi.CodeUnsupportedMedia, "application/json"},
		{"create target too large", "POST", "/v1/targets", `{"name":"` + strings.Repeat("x", ctlapi.MaxBodySize) + `"}`, "", 413, ctlapi.CodeTooLarge, "larger than"},
		{"persist typo", "POST", "/v1/targets?presist=1", `{}`, "", 400, ctlapi.CodeInvalidArgument, `unknown query parameter \"presist\" (accepted: persist)`},
		{"persist value", "POST", "/v1/targets?persist=maybe", `{}`, "", 400, ctlapi.CodeInvalidArgument, "want 1 or 0"},
		{"delete with sessions", "DELETE", "/v1/targets/demo", "", "", 409, ctlapi.CodeConflict, "logged-in sessions"},
		{"delete missing", "DELETE", "/v1/targets/nope", "", "", 404, ctlapi.CodeNotFound, "not found"},
		{"list luns", "GET", "/v1/targets/demo/luns", "", "", 200, "", `"backend": "ram"`},
		{"add lun", "POST", "/v1/targets/demo/luns", `{"id":1,"backend":"ram","size":"1MiB"}`, "", 201, "", `"capacity": 1048576`},
		{"add lun invalid", "POST", "/v1/targets/demo/luns", `{"id":1,"backend":"tape"}`, "", 400, ctlapi.CodeInvalidArgument, `tape`},
		{"add lun missing target", "POST", "/v1/targets/zz/luns", `{"id":1,"backend":"ram","size":"1MiB"}`, "", 404, ctlapi.CodeNotFound, "not found"},
		{"remove lun in use", "DELETE", "/v1/targets/demo/luns/0", "", "", 409, ctlapi.CodeConflict, "listed by the ACL"},
		{"remove lun bad id", "DELETE", "/v1/targets/demo/luns/x", "", "", 400, ctlapi.CodeInvalidArgument, "want a number"},
		{"remove lun missing", "DELETE", "/v1/targets/demo/luns/9", "", "", 404, ctlapi.CodeNotFound, "LUN 9"},
		{"list acls", "GET", "/v1/targets/demo/acls", "", "", 200, "", `"sessions": 1`},
		{"add acl", "POST", "/v1/targets/demo/acls", `{"initiator":"*","read_only":true}`, "", 201, "", `"initiator": "*"`},
		{"add acl bad lun", "POST", "/v1/targets/demo/acls", `{"initiator":"*","luns":[4]}`, "", 400, ctlapi.CodeInvalidArgument, "LUN 4 is not defined"},
		{"add acl bad initiator", "POST", "/v1/targets/demo/acls", `{"initiator":"me"}`, "", 400, ctlapi.CodeInvalidArgument, "invalid initiator"},
		{"remove acl", "DELETE", "/v1/targets/demo/acls/0x00000000000000000000000000000009", "", "", 204, "", ""},
		{"remove acl any missing", "DELETE", "/v1/targets/demo/acls/*", "", "", 404, ctlapi.CodeNotFound, "not found"},
		{"remove acl bad", "DELETE", "/v1/targets/demo/acls/nobody", "", "", 400, ctlapi.CodeInvalidArgument, "invalid initiator"},
		{"list sessions", "GET", "/v1/sessions", "", "", 200, "", `"id": "s1"`},
		{"list sessions of target", "GET", "/v1/sessions?target=demo", "", "", 200, "", `"id": "s1"`},
		{"list sessions of missing target", "GET", "/v1/sessions?target=zz", "", "", 404, ctlapi.CodeNotFound, "not found"},
		{"show session", "GET", "/v1/sessions/s1", "", "", 200, "", `"channels": 2`},
		{"kill missing session", "DELETE", "/v1/sessions/s9", "", "", 404, ctlapi.CodeNotFound, "not found"},
		{"list connections", "GET", "/v1/connections", "", "", 200, "", `"name": "up"`},
		{"show connection", "GET", "/v1/connections/up", "", "", 200, "", `"state": "running"`},
		{"connect", "POST", "/v1/connections", `{"name":"c2","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","dev_loss_tmo":"off"}`, "", 201, "", `"dev_loss_tmo": "off"`},
		{"connect bad timeouts", "POST", "/v1/connections", `{"name":"c3","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","reconnect_delay":"0s"}`, "", 400, ctlapi.CodeInvalidArgument, "reconnect_delay"},
		{"connect duplicate", "POST", "/v1/connections", `{"name":"up","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000006"}`, "", 409, ctlapi.CodeAlreadyExists, "already exists"},
		{"disconnect missing", "DELETE", "/v1/connections/zz", "", "", 404, ctlapi.CodeNotFound, "not found"},
		{"reload", "POST", "/v1/reload", "", "", 200, "", `"changes": []`},
		{"unknown route", "GET", "/v1/frobnicate", "", "", 404, ctlapi.CodeNotFound, "no API route GET /v1/frobnicate"},
		{"old version", "GET", "/v0/status", "", "", 404, ctlapi.CodeNotFound, "no API route"},
		{"wrong method", "PUT", "/v1/targets", "", "", 405, ctlapi.CodeMethodNotAllowed, "method PUT is not allowed"},
		{"unclean path", "GET", "/v1//connections", "", "", 404, ctlapi.CodeNotFound, "did you mean /v1/connections?"},
		{"dot segment", "DELETE", "/v1/targets/demo/luns/../../demo", "", "", 404, ctlapi.CodeNotFound, "no API route"},
		{"query on a route without", "GET", "/v1/status?verbose=1", "", "", 400, ctlapi.CodeInvalidArgument, "takes none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ctlapi.Handler(newFake(t))
			req := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
			if tt.ctype != "" {
				req.Header.Set("Content-Type", tt.ctype)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tt.status, body)
			}
			if rec.Header().Get(ctlapi.VersionHeader) != "1" {
				t.Errorf("no %s header", ctlapi.VersionHeader)
			}
			if tt.code != "" {
				var eb ctlapi.ErrorBody
				if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
					t.Fatalf("error body is not JSON: %v: %s", err, body)
				}
				if eb.Error.Code != tt.code || tt.code.HTTPStatus() != rec.Code {
					t.Fatalf("code %q (status %d), want %q: %s", eb.Error.Code, rec.Code, tt.code, body)
				}
			}
			if !strings.Contains(body, tt.contains) {
				t.Fatalf("body lacks %q:\n%s", tt.contains, body)
			}
			if tt.status == http.StatusMethodNotAllowed && !strings.Contains(rec.Header().Get("Allow"), "GET") {
				t.Errorf("Allow = %q", rec.Header().Get("Allow"))
			}
		})
	}
}

func TestPersistAndForce(t *testing.T) {
	f := newFake(t)
	h := ctlapi.Handler(f)
	do := func(method, path, body string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		return rec.Code
	}
	if code := do("POST", "/v1/targets/demo/luns", `{"id":1,"backend":"ram","size":"1MiB"}`); code != 201 {
		t.Fatal(code)
	}
	if n := len(f.Persisted()); n != 0 {
		t.Fatalf("persisted %d times without persist=1", n)
	}
	if code := do("POST", "/v1/targets/demo/luns?persist=1", `{"id":2,"backend":"ram","size":"1MiB"}`); code != 201 {
		t.Fatal(code)
	}
	p := f.Persisted()
	if len(p) != 1 || p[0].Target("demo").LUN(2) == nil {
		t.Fatalf("persisted: %v", p)
	}
	if code := do("DELETE", "/v1/targets/demo?force=1&persist=true", ""); code != 204 {
		t.Fatal(code)
	}
	if f.Config().Target("demo") != nil || len(f.Persisted()) != 2 {
		t.Fatal("force delete did not delete or persist")
	}
}

func TestServiceErrorsMapToCodes(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code ctlapi.Code
	}{
		{ctlapi.ErrUnavailable, ctlapi.CodeUnavailable},
		{ctlapi.ErrUnsupported, ctlapi.CodeUnsupported},
		{config.ErrUnsupported, ctlapi.CodeUnsupported},
		{ctlapi.ErrPermission, ctlapi.CodePermissionDenied},
		{errors.New("disk on fire"), ctlapi.CodeInternal},
		{&ctlapi.APIError{Code: ctlapi.CodeNotFound, Message: "proxied"}, ctlapi.CodeNotFound},
	} {
		f := newFake(t)
		f.FailNext("ListTargets", tt.err)
		rec := httptest.NewRecorder()
		ctlapi.Handler(f).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/targets", nil))
		var eb ctlapi.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code != tt.code || rec.Code != tt.code.HTTPStatus() {
			t.Errorf("%v: status %d body %s, want %s", tt.err, rec.Code, rec.Body, tt.code)
		}
		if !strings.Contains(eb.Error.Message, strings.SplitN(tt.err.Error(), "\n", 2)[0]) {
			t.Errorf("message %q lacks %q", eb.Error.Message, tt.err)
		}
	}
}

// nilService panics on every call: Handler must answer 500 and keep serving.
type nilService struct{ ctlapi.Service }

func TestPanicIsInternalError(t *testing.T) {
	h := ctlapi.Handler(nilService{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/status", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), `"code": "internal"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}
