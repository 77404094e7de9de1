package ctlapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"

	"github.com/srpd/srpd/internal/config"
)

// DefaultSocket is where the daemon listens unless configured otherwise.
const DefaultSocket = config.DefaultControlSocket

// Client calls the control API over the daemon's unix socket. It implements Service, so a
// Client can stand wherever a Service can. Safe for concurrent use.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client of the daemon listening on socket ("" = DefaultSocket). Calls are
// bounded by their context only.
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableCompression: true,
		MaxIdleConns:       2,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

// Socket returns the socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

var _ Service = (*Client)(nil)

// do sends one request; body (if not nil) is sent as JSON, and a 2xx response is decoded into
// out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	u := "http://srpd" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("ctlapi: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("ctlapi: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.connError(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("ctlapi: %s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
			return &APIError{StatusCode: resp.StatusCode, Code: codeOfStatus(resp.StatusCode),
				Message: fmt.Sprintf("%s %s: HTTP %s", method, path, resp.Status)}
		}
		return &APIError{StatusCode: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, Details: eb.Error.Details}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("ctlapi: %s %s: decode response: %w", method, path, err)
	}
	return nil
}

func codeOfStatus(status int) Code {
	for _, c := range []Code{CodeInvalidArgument, CodePermissionDenied, CodeNotFound, CodeMethodNotAllowed,
		CodeConflict, CodeTooLarge, CodeUnsupportedMedia, CodeUnsupported, CodeUnavailable} {
		if c.HTTPStatus() == status {
			return c
		}
	}
	return CodeInternal
}

// connError classifies a failure to talk to the socket.
func (c *Client) connError(err error) error {
	var kind error
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOTSOCK):
		kind = ErrDaemonNotRunning
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		kind = ErrPermission
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("ctlapi: %s: %w", c.socket, err)
	}
	return &SocketError{Socket: c.socket, Kind: kind, Err: err}
}

func mutateQuery(o MutateOptions) url.Values {
	if !o.Persist {
		return nil
	}
	return url.Values{"persist": {"1"}}
}

// call does a request whose answer is one object of type T.
func call[T any](ctx context.Context, c *Client, method, path string, q url.Values, body any) (*T, error) {
	var v T
	if err := c.do(ctx, method, path, q, body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

func targetPath(name string) string { return "/v1/targets/" + url.PathEscape(name) }

// Status implements Service.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	return call[Status](ctx, c, http.MethodGet, "/v1/status", nil, nil)
}

// ListTargets implements Service.
func (c *Client) ListTargets(ctx context.Context) ([]TargetInfo, error) {
	var l TargetList
	err := c.do(ctx, http.MethodGet, "/v1/targets", nil, nil, &l)
	return l.Targets, err
}

// GetTarget implements Service.
func (c *Client) GetTarget(ctx context.Context, name string) (*TargetInfo, error) {
	return call[TargetInfo](ctx, c, http.MethodGet, targetPath(name), nil, nil)
}

// CreateTarget implements Service.
func (c *Client) CreateTarget(ctx context.Context, t config.Target, opts MutateOptions) (*TargetInfo, error) {
	return call[TargetInfo](ctx, c, http.MethodPost, "/v1/targets", mutateQuery(opts), t)
}

// DeleteTarget implements Service.
func (c *Client) DeleteTarget(ctx context.Context, name string, opts DeleteOptions) error {
	q := mutateQuery(MutateOptions{Persist: opts.Persist})
	if opts.Force {
		if q == nil {
			q = url.Values{}
		}
		q.Set("force", "1")
	}
	return c.do(ctx, http.MethodDelete, targetPath(name), q, nil, nil)
}

// ListLUNs implements Service.
func (c *Client) ListLUNs(ctx context.Context, target string) ([]LUNInfo, error) {
	var l LUNList
	err := c.do(ctx, http.MethodGet, targetPath(target)+"/luns", nil, nil, &l)
	return l.LUNs, err
}

// AddLUN implements Service.
func (c *Client) AddLUN(ctx context.Context, target string, l config.LUN, opts MutateOptions) (*LUNInfo, error) {
	return call[LUNInfo](ctx, c, http.MethodPost, targetPath(target)+"/luns", mutateQuery(opts), l)
}

// RemoveLUN implements Service.
func (c *Client) RemoveLUN(ctx context.Context, target string, id int, opts MutateOptions) error {
	return c.do(ctx, http.MethodDelete, targetPath(target)+"/luns/"+strconv.Itoa(id), mutateQuery(opts), nil, nil)
}

// ListACLs implements Service.
func (c *Client) ListACLs(ctx context.Context, target string) ([]ACLInfo, error) {
	var l ACLList
	err := c.do(ctx, http.MethodGet, targetPath(target)+"/acls", nil, nil, &l)
	return l.ACLs, err
}

// AddACL implements Service.
func (c *Client) AddACL(ctx context.Context, target string, a config.ACL, opts MutateOptions) (*ACLInfo, error) {
	return call[ACLInfo](ctx, c, http.MethodPost, targetPath(target)+"/acls", mutateQuery(opts), a)
}

// RemoveACL implements Service.
func (c *Client) RemoveACL(ctx context.Context, target string, ini config.InitiatorID, opts MutateOptions) error {
	return c.do(ctx, http.MethodDelete, targetPath(target)+"/acls/"+url.PathEscape(ini.String()), mutateQuery(opts), nil, nil)
}

// ListSessions implements Service.
func (c *Client) ListSessions(ctx context.Context, f SessionFilter) ([]SessionInfo, error) {
	var q url.Values
	if f.Target != "" {
		q = url.Values{"target": {f.Target}}
	}
	var l SessionList
	err := c.do(ctx, http.MethodGet, "/v1/sessions", q, nil, &l)
	return l.Sessions, err
}

// GetSession implements Service.
func (c *Client) GetSession(ctx context.Context, id string) (*SessionInfo, error) {
	return call[SessionInfo](ctx, c, http.MethodGet, "/v1/sessions/"+url.PathEscape(id), nil, nil)
}

// KillSession implements Service.
func (c *Client) KillSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil, nil, nil)
}

// ListConnections implements Service.
func (c *Client) ListConnections(ctx context.Context) ([]ConnectionInfo, error) {
	var l ConnectionList
	err := c.do(ctx, http.MethodGet, "/v1/connections", nil, nil, &l)
	return l.Connections, err
}

// GetConnection implements Service.
func (c *Client) GetConnection(ctx context.Context, name string) (*ConnectionInfo, error) {
	return call[ConnectionInfo](ctx, c, http.MethodGet, "/v1/connections/"+url.PathEscape(name), nil, nil)
}

// Connect implements Service.
func (c *Client) Connect(ctx context.Context, s config.Session, opts MutateOptions) (*ConnectionInfo, error) {
	return call[ConnectionInfo](ctx, c, http.MethodPost, "/v1/connections", mutateQuery(opts), s)
}

// Disconnect implements Service.
func (c *Client) Disconnect(ctx context.Context, name string, opts MutateOptions) error {
	return c.do(ctx, http.MethodDelete, "/v1/connections/"+url.PathEscape(name), mutateQuery(opts), nil, nil)
}

// Reload implements Service.
func (c *Client) Reload(ctx context.Context) (*ReloadResult, error) {
	return call[ReloadResult](ctx, c, http.MethodPost, "/v1/reload", nil, nil)
}
