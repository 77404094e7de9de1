package ctlapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// serviceOnly hides the Fake's optional interfaces: a daemon without ConfigService.
type serviceOnly struct{ ctlapi.Service }

func TestConfigRoutes(t *testing.T) {
	f := newFake(t)
	full := httptest.NewServer(ctlapi.Handler(f))
	defer full.Close()
	bare := httptest.NewServer(ctlapi.Handler(serviceOnly{f}))
	defer bare.Close()
	for _, tc := range []struct {
		name, srv, method, path string
		status                  int
		contains                string
	}{
		{"config", full.URL, "GET", "/v1/config", 200, `"unsaved": []`},
		{"config unsupported", bare.URL, "GET", "/v1/config", 501, `"code": "unsupported"`},
		{"save", full.URL, "POST", "/v1/config/save", 200, `"changes": []`},
		{"save bad force", full.URL, "POST", "/v1/config/save?force=maybe", 400, "want 1 or 0"},
		{"dry run", full.URL, "POST", "/v1/reload?dry_run=1", 200, `"dry_run": true`},
		{"dry run unsupported", bare.URL, "POST", "/v1/reload?dry_run=1", 501, "unsupported"},
		{"plain reload without ConfigService", bare.URL, "POST", "/v1/reload", 200, `"changes": []`},
		{"reload typo", full.URL, "POST", "/v1/reload?dryrun=1", 400, "accepted: dry_run, refuse_discard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, tc.srv+tc.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.contains) {
				t.Fatalf("%s %s: %d %s, want %d with %q", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.contains)
			}
		})
	}
}

func TestClientConfigService(t *testing.T) {
	f := newFake(t)
	c := serve(t, f)
	ctx := context.Background()
	if _, err := c.AddLUN(ctx, "demo", config.LUN{ID: 1, Backend: config.BackendRAM, Size: 1 << 20}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	info, err := c.RunningConfig(ctx)
	if err != nil || info.Config.Target("demo").LUN(1) == nil || len(info.Unsaved) != 1 {
		t.Fatalf("RunningConfig = %+v, %v", info, err)
	}
	if _, err := c.ReloadWith(ctx, ctlapi.ReloadOptions{RefuseDiscard: true}); !errors.Is(err, ctlapi.ErrConflict) {
		t.Fatalf("guarded reload: %v", err)
	}
	res, err := c.SaveConfig(ctx, ctlapi.SaveOptions{})
	if err != nil || len(res.Changes) != 1 {
		t.Fatalf("SaveConfig = %+v, %v", res, err)
	}
	if res, err := c.ReloadWith(ctx, ctlapi.ReloadOptions{RefuseDiscard: true}); err != nil || len(res.Changes) != 0 {
		t.Fatalf("guarded reload after save = %+v, %v", res, err)
	}
}
