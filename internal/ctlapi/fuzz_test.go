package ctlapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/ctlapi/ctlapitest"
	"github.com/srpd/srpd/internal/fuzzbound"
)

// The fuzz targets send arbitrary request bodies (and, for FuzzRequest, methods, paths and
// queries) to Handler over the in-memory Fake, which validates a mutation the way the daemon
// does. Whatever comes in: no panic (Handler would turn one into a 500), no 5xx at all — a
// malformed body is the client's fault, answered with a 4xx whose JSON error body carries a
// code matching the status —, and what a 2xx leaves running is a valid configuration.

// fuzzBase is baseConfig (with allowed_paths, so LUN paths are checked against it) parsed
// once; every input gets a Fake on a clone of it.
func fuzzBase(f *testing.F) *config.Config {
	f.Helper()
	c, err := config.Parse("base.yaml", []byte(baseConfig+"allowed_paths: [/var/lib/srpd, /dev]\n"))
	if err != nil {
		f.Fatal(err)
	}
	return c
}

// serveOnce sends one request to a fresh Fake and checks the response.
func serveOnce(t *testing.T, base *config.Config, method, target, ctype string, body []byte) {
	fake := ctlapitest.NewFake(base)
	fake.AddSession(ctlapi.SessionInfo{ID: "s1", Target: "demo", Initiator: config.MakePortID(0, 9), Channels: 2, State: ctlapi.StateLoggedIn})
	req := httptest.NewRequest(method, "/", bytes.NewReader(body))
	req.Method = method
	req.URL.Path, req.URL.RawQuery, _ = strings.Cut(target, "?")
	req.URL.RawPath = ""
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	rec := httptest.NewRecorder()
	// With the optional services a daemon has (stats), so that their routes are fuzzed too.
	ctlapi.Handler(ctlapitest.NewStatsFake(fake, ctlapi.Stats{})).ServeHTTP(rec, req)
	checkResponse(t, rec, method, target, body)
	if rec.Code < 300 {
		if err := fake.Config().Validate(); err != nil {
			t.Errorf("%s %s %q: %d, and the configuration left running is invalid: %v", method, target, body, rec.Code, err)
		}
	}
}

func checkResponse(t *testing.T, rec *httptest.ResponseRecorder, method, target string, body []byte) {
	t.Helper()
	if rec.Code >= 500 {
		t.Errorf("%s %s %q: status %d (a request must never cause a 5xx): %s", method, target, body, rec.Code, rec.Body)
		return
	}
	if rec.Code < 200 || (rec.Code >= 300 && rec.Code < 400) {
		t.Errorf("%s %s %q: status %d", method, target, body, rec.Code)
		return
	}
	if rec.Code == http.StatusNoContent {
		if rec.Body.Len() != 0 {
			t.Errorf("%s %s: 204 with a body %q", method, target, rec.Body)
		}
		return
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Errorf("%s %s %q: %d with a body that is not JSON: %q", method, target, body, rec.Code, rec.Body)
		return
	}
	if rec.Code < 400 {
		return
	}
	var eb ctlapi.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
		t.Errorf("%s %s %q: %d with an error body without code or message: %s (%v)", method, target, body, rec.Code, rec.Body, err)
		return
	}
	if eb.Error.Code.HTTPStatus() != rec.Code {
		t.Errorf("%s %s %q: status %d but code %q (%d)", method, target, body, rec.Code, eb.Error.Code, eb.Error.Code.HTTPStatus())
	}
}

// bodySeeds are bodies for every body-taking route, valid and broken.
var bodySeeds = map[string][]string{
	"/v1/targets": {
		`{"name":"t2","port_id":"0x00000000000000010000000000000002"}`,
		`{"name":"t3","port_id":"0x00000000000000010000000000000003","luns":[{"id":1,"backend":"ram","size":"1MiB"}],"acls":[{"initiator":"*","luns":[1]}]}`,
		`{"name":"t4","port_id":{"id_ext":"1","ioc_guid":"2"}}`,
		`{"name":"t5","port_id":"0x00000000000000010000000000000005","limits":{"queue_depth":1,"max_it_iu_len":"1GiB","immediate_data":null}}`,
		`{"name":"t6","port_id":"0x00000000000000010000000000000006","listen":["10.0.0.1","::1"],"cm_port":70000}`,
		`{"name":"t7","port_id":"0x00000000000000010000000000000007","luns":[{"id":0,"backend":"file","path":"/srv/../etc/passwd"}]}`,
		`{"name":"demo","port_id":"0x00000000000000010000000000000001"}`,
		`null`, `[]`, `{}`, `{"name":`, `{"name":"x"} {}`, `{"name":"t8","port_id":1e400}`,
	},
	"/v1/targets/demo/luns": {
		`{"id":1,"backend":"ram","size":"1MiB"}`,
		`{"id":2,"backend":"file","path":"/var/lib/srpd/a.img","create":true,"size":4096,"follow_symlinks":true}`,
		`{"id":3,"backend":"blockdev","path":"/dev/disk/by-id/x","size":512}`,
		`{"id":16384,"backend":"ram","size":-1}`,
		`{"id":1,"backend":"ram","size":"99999999999PiB"}`,
		`{"id":1,"backend":"ram","size":1000,"block_size":4096}`,
		`{"id":0,"backend":"ram","size":"1MiB"}`,
		`{"id":4,"backend":"file","path":"/run/srpd/srpd.sock"}`,
		`{"id":5,"backend":"file","path":"rel.img"}`,
		`{"id":6,"backend":"ram","size":"1MiB","serial":"\u0000\u00ff"}`,
		`{"id":"1"}`, `{"id":1.5}`, `true`,
	},
	"/v1/targets/demo/acls": {
		`{"initiator":"*","read_only":true}`,
		`{"initiator":"0x00000000000000000000000000000008","luns":[0,0]}`,
		`{"initiator":"0x00000000000000000000000000000009"}`,
		`{"initiator":"*","luns":[-1,99999]}`,
		`{"initiator":""}`, `{"initiator":5}`, `{"luns":null}`,
	},
	"/v1/connections": {
		`{"name":"c2","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","dev_loss_tmo":"off"}`,
		`{"name":"c3","address":"host.example","port":0,"target_port_id":"0x00000000000000010000000000000005","reconnect_delay":"0s","fast_io_fail_tmo":"off","dev_loss_tmo":"off"}`,
		`{"name":"c4","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","nbd":[{"lun":0,"socket":"/run/srpd/c4.nbd"},{"lun":0,"socket":"/run/srpd/c4.nbd"}]}`,
		`{"name":"c5","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","connect_timeout":"-1s","max_it_iu_len":"1TiB"}`,
		`{"name":"c6","address":"10.0.0.2","target_port_id":"0x00000000000000010000000000000005","initiator_ext":"zz"}`,
		`{"name":"up","address":"127.0.0.1","target_port_id":"0x00000000000000010000000000000001"}`,
		`{"reconnect_delay":12}`,
	},
}

// fuzzBody fuzzes the body of one POST route.
func fuzzBody(f *testing.F, path string) {
	base := fuzzBase(f)
	for _, s := range bodySeeds[path] {
		f.Add([]byte(s), "")
	}
	f.Add([]byte(bodySeeds[path][0]), "application/json; charset=utf-8")
	f.Add([]byte(bodySeeds[path][0]), "text/yaml")
	f.Add([]byte(bodySeeds[path][0]), "application/json; ;")
	f.Fuzz(func(t *testing.T, body []byte, ctype string) {
		fuzzbound.Run(t, func() {
			serveOnce(t, base, http.MethodPost, path, ctype, body)
			serveOnce(t, base, http.MethodPost, path+"?persist=1", ctype, body)
		})
	})
}

// FuzzCreateTargetBody: POST /v1/targets bodies (config.Target decoding, defaults, Validate).
func FuzzCreateTargetBody(f *testing.F) { fuzzBody(f, "/v1/targets") }

// FuzzAddLUNBody: POST /v1/targets/{target}/luns bodies (config.LUN).
func FuzzAddLUNBody(f *testing.F) { fuzzBody(f, "/v1/targets/demo/luns") }

// FuzzAddACLBody: POST /v1/targets/{target}/acls bodies (config.ACL).
func FuzzAddACLBody(f *testing.F) { fuzzBody(f, "/v1/targets/demo/acls") }

// FuzzConnectBody: POST /v1/connections bodies (config.Session, its timeouts and NBD exports).
func FuzzConnectBody(f *testing.F) { fuzzBody(f, "/v1/connections") }

// FuzzRequest: any method, path (with its parameters: target and connection names, LUN
// numbers, initiator IDs, session IDs), query and body.
func FuzzRequest(f *testing.F) {
	base := fuzzBase(f)
	for _, s := range []struct{ method, target, body string }{
		{"GET", "/v1/status", ""},
		{"GET", "/v1/targets/demo", ""},
		{"DELETE", "/v1/targets/demo?force=1&persist=yes", ""},
		{"DELETE", "/v1/targets/demo/luns/0", ""},
		{"DELETE", "/v1/targets/demo/luns/-0", ""},
		{"DELETE", "/v1/targets/demo/luns/99999999999999999999", ""},
		{"DELETE", "/v1/targets/demo/acls/*", ""},
		{"DELETE", "/v1/targets/demo/acls/0x00000000000000000000000000000009", ""},
		{"GET", "/v1/sessions?target=demo&target=x", ""},
		{"GET", "/v1/sessions/s1", ""},
		{"DELETE", "/v1/sessions/" + strings.Repeat("x", 300), ""},
		{"GET", "/v1/connections/up", ""},
		{"DELETE", "/v1/connections/up?persist=1", ""},
		{"POST", "/v1/reload", "{}"},
		{"POST", "/v1/targets/%2e%2e/luns", `{"id":1,"backend":"ram","size":"1MiB"}`},
		{"PATCH", "/v1/targets", ""},
		{"GET", "/v1/targets?persist", ""},
		{"GET", "//v1//targets/", ""},
		{"POST", "/v1/discover", `{"address":"127.0.0.1","port":5555}`},
		{"POST", "/v1/discover", `{"address":"127.0.0.1","target_port_id":"0x00000000000000010000000000000001"}`},
		{"POST", "/v1/discover", `{"address":"","port":70000,"transport":"../x"}`},
	} {
		f.Add(s.method, s.target, []byte(s.body))
	}
	methods := map[string]bool{"GET": true, "POST": true, "DELETE": true, "PUT": true, "PATCH": true, "HEAD": true}
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		if !methods[method] || !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n\x00#") {
			return // not something net/http would hand to a handler
		}
		fuzzbound.Run(t, func() {
			serveOnce(t, base, method, target, "", body)
		})
	})
}
