package ctlapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/srpd/srpd/internal/config"
)

// MaxBodySize bounds a request body.
const MaxBodySize = 1 << 20

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Handler serves the /v1/ routes over svc. It decodes and validates requests, maps errors to
// codes and statuses, answers unknown routes and methods with JSON errors too, and turns a
// panicking Service call into an internal error.
func Handler(svc Service) http.Handler {
	h := &handler{svc: svc, mux: http.NewServeMux()}
	for _, r := range []struct {
		pattern string
		query   []string // accepted query parameters
		fn      func(w http.ResponseWriter, r *http.Request, q query) error
	}{
		{"GET /v1/status", nil, h.status},
		{"GET /v1/targets", nil, h.listTargets},
		{"POST /v1/targets", []string{"persist"}, h.createTarget},
		{"GET /v1/targets/{target}", nil, h.getTarget},
		{"DELETE /v1/targets/{target}", []string{"persist", "force"}, h.deleteTarget},
		{"GET /v1/targets/{target}/luns", nil, h.listLUNs},
		{"POST /v1/targets/{target}/luns", []string{"persist"}, h.addLUN},
		{"DELETE /v1/targets/{target}/luns/{lun}", []string{"persist"}, h.removeLUN},
		{"PATCH /v1/targets/{target}/luns/{lun}", []string{"persist"}, h.updateLUN},
		{"GET /v1/targets/{target}/acls", nil, h.listACLs},
		{"POST /v1/targets/{target}/acls", []string{"persist"}, h.addACL},
		{"DELETE /v1/targets/{target}/acls/{initiator}", []string{"persist"}, h.removeACL},
		{"PUT /v1/targets/{target}/acls/{initiator}", []string{"persist"}, h.updateACL},
		{"GET /v1/targets/{target}/alua", nil, h.getALUA},
		{"POST /v1/targets/{target}/alua", nil, h.setALUA},
		{"GET /v1/sessions", []string{"target"}, h.listSessions},
		{"GET /v1/stats", []string{"target"}, h.stats},
		{"GET /v1/sessions/{id}", nil, h.getSession},
		{"DELETE /v1/sessions/{id}", nil, h.killSession},
		{"GET /v1/connections", nil, h.listConnections},
		{"POST /v1/connections", []string{"persist"}, h.connect},
		{"GET /v1/connections/{name}", nil, h.getConnection},
		{"DELETE /v1/connections/{name}", []string{"persist"}, h.disconnect},
		{"POST /v1/reload", []string{"dry_run", "refuse_discard"}, h.reload},
		{"POST /v1/discover", nil, h.discover},
		{"GET /v1/multipath", nil, h.listMultipath},
		{"GET /v1/config", nil, h.runningConfig},
		{"POST /v1/config/save", []string{"force"}, h.saveConfig},
	} {
		h.mux.Handle(r.pattern, route(r.query, r.fn))
	}
	return h
}

type handler struct {
	svc Service
	mux *http.ServeMux
}

// httpError is an error the handler itself decided the code of (a bad request).
type httpError struct {
	code Code
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{CodeInvalidArgument, fmt.Sprintf(format, args...)}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(VersionHeader, strconv.Itoa(APIVersion))
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			writeError(w, APIErrorInfo{Code: CodeInternal, Message: fmt.Sprintf("internal error: %v", p)})
		}
	}()
	if clean := path.Clean(r.URL.Path); clean != r.URL.Path && clean+"/" != r.URL.Path {
		// ServeMux would answer a path with "//", "." or ".." with a 307 to the clean path (an
		// HTML body, and a mutation replayed by whoever follows it): no route has such a path.
		writeError(w, APIErrorInfo{Code: CodeNotFound,
			Message: fmt.Sprintf("no API route %s %s (paths are clean: did you mean %s?)", r.Method, r.URL.Path, clean)})
		return
	}
	if _, pattern := h.mux.Handler(r); pattern == "" {
		// No route: let the mux tell 404 from 405 (it sets Allow), then answer in JSON.
		rec := &recorder{header: http.Header{}}
		h.mux.ServeHTTP(rec, r)
		if rec.status == http.StatusMethodNotAllowed {
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeError(w, APIErrorInfo{Code: CodeMethodNotAllowed,
				Message: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)})
			return
		}
		writeError(w, APIErrorInfo{Code: CodeNotFound, Message: fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path)})
		return
	}
	h.mux.ServeHTTP(w, r)
}

// recorder captures what the mux's own 404/405 handlers write.
type recorder struct {
	header http.Header
	status int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(status int)      { r.status = status }

// query is the parsed, checked query string of a request.
type query url.Values

func (q query) bool(name string) (bool, error) {
	v := url.Values(q).Get(name)
	switch strings.ToLower(v) {
	case "", "0", "false", "no":
		return false, nil
	case "1", "true", "yes":
		return true, nil
	}
	return false, badRequest("query parameter %s=%q: want 1 or 0", name, v)
}

func (q query) mutate() (MutateOptions, error) {
	p, err := q.bool("persist")
	return MutateOptions{Persist: p}, err
}

func route(allowed []string, fn func(w http.ResponseWriter, r *http.Request, q query) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		for k := range q {
			ok := false
			for _, a := range allowed {
				ok = ok || a == k
			}
			if !ok {
				if len(allowed) == 0 {
					writeError(w, APIErrorInfo{Code: CodeInvalidArgument, Message: fmt.Sprintf("unknown query parameter %q (this route takes none)", k)})
				} else {
					writeError(w, APIErrorInfo{Code: CodeInvalidArgument, Message: fmt.Sprintf("unknown query parameter %q (accepted: %s)", k, strings.Join(allowed, ", "))})
				}
				return
			}
		}
		if err := fn(w, r, query(q)); err != nil {
			var he *httpError
			if errors.As(err, &he) {
				writeError(w, APIErrorInfo{Code: he.code, Message: he.msg})
				return
			}
			writeError(w, errorInfo(err))
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, info APIErrorInfo) {
	writeJSON(w, info.Code.HTTPStatus(), ErrorBody{Error: info})
}

// decodeBody decodes a JSON request body strictly into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return &httpError{CodeUnsupportedMedia, fmt.Sprintf("Content-Type %q: the body must be application/json", ct)}
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodySize))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return &httpError{CodeTooLarge, fmt.Sprintf("request body larger than %d bytes", MaxBodySize)}
		case errors.Is(err, io.EOF):
			return badRequest("request body required (JSON)")
		}
		return badRequest("invalid request body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("invalid request body: data after the JSON value")
	}
	return nil
}

func pathName(r *http.Request, key string) (string, error) {
	v := r.PathValue(key)
	if !nameRE.MatchString(v) {
		return "", badRequest("%s %q: %s", key, v, "names are 1 to 64 letters, digits, '.', '_' or '-'")
	}
	return v, nil
}

// validationError turns a config.ErrorList into a 400 naming the object.
func validationError(what string, err error) error {
	var list config.ErrorList
	if errors.As(err, &list) {
		return invalidRequest{fmt.Errorf("invalid %s: %w", what, list)}
	}
	return badRequest("invalid %s: %v", what, err)
}

// created answers 201 with v and its location, or returns err (the Service call's).
func created(w http.ResponseWriter, location string, v any, err error) error {
	if err != nil {
		return err
	}
	w.Header().Set("Location", location)
	writeJSON(w, http.StatusCreated, v)
	return nil
}

// noContent answers 204, or returns err (the Service call's).
func noContent(w http.ResponseWriter, err error) error {
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func ok(w http.ResponseWriter, v any, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// decodeObject decodes a config object from the body strictly, fills in its defaults where it
// has any and validates it; what names it in the error.
func decodeObject(w http.ResponseWriter, r *http.Request, what string, v interface{ Validate() error }) error {
	if err := decodeBody(w, r, v); err != nil {
		return err
	}
	if d, ok := v.(interface{ SetDefaults() }); ok {
		d.SetDefaults()
	}
	if err := v.Validate(); err != nil {
		return validationError(what, err)
	}
	return nil
}

// targetMutation is the target named in the path and the options of a mutation of it.
func targetMutation(r *http.Request, q query) (string, MutateOptions, error) {
	target, err := pathName(r, "target")
	if err != nil {
		return "", MutateOptions{}, err
	}
	opts, err := q.mutate()
	return target, opts, err
}

// lunMutation is targetMutation for a route that names a LUN too: the target, the LUN number
// and the options.
func lunMutation(r *http.Request, q query) (string, int, MutateOptions, error) {
	target, opts, err := targetMutation(r, q)
	if err != nil {
		return "", 0, opts, err
	}
	id, err := strconv.Atoi(r.PathValue("lun"))
	if err != nil || id < 0 || id > config.MaxLUNID {
		return "", 0, opts, badRequest("LUN %q: want a number between 0 and %d", r.PathValue("lun"), config.MaxLUNID)
	}
	return target, id, opts, nil
}

// aclMutation is targetMutation for a route that names an initiator too: the target, the
// initiator port ID and the options.
func aclMutation(r *http.Request, q query) (string, config.InitiatorID, MutateOptions, error) {
	target, opts, err := targetMutation(r, q)
	if err != nil {
		return "", config.InitiatorID{}, opts, err
	}
	ini, err := config.ParseInitiatorID(r.PathValue("initiator"))
	if err != nil {
		return "", config.InitiatorID{}, opts, badRequest("%v", err)
	}
	return target, ini, opts, nil
}

func (h *handler) status(w http.ResponseWriter, r *http.Request, _ query) error {
	st, err := h.svc.Status(r.Context())
	return ok(w, st, err)
}

func (h *handler) listTargets(w http.ResponseWriter, r *http.Request, _ query) error {
	ts, err := h.svc.ListTargets(r.Context())
	return ok(w, TargetList{Targets: nonNil(ts)}, err)
}

func (h *handler) getTarget(w http.ResponseWriter, r *http.Request, _ query) error {
	return byName(w, r, "target", h.svc.GetTarget)
}

// byName answers a GET with what get returns for the name that the path's key holds.
func byName[T any](w http.ResponseWriter, r *http.Request, key string, get func(context.Context, string) (T, error)) error {
	name, err := pathName(r, key)
	if err != nil {
		return err
	}
	v, err := get(r.Context(), name)
	return ok(w, v, err)
}

func (h *handler) createTarget(w http.ResponseWriter, r *http.Request, q query) error {
	opts, err := q.mutate()
	if err != nil {
		return err
	}
	var t config.Target
	if err := decodeObject(w, r, "target", &t); err != nil {
		return err
	}
	info, err := h.svc.CreateTarget(r.Context(), t, opts)
	return created(w, "/v1/targets/"+url.PathEscape(t.Name), info, err)
}

func (h *handler) deleteTarget(w http.ResponseWriter, r *http.Request, q query) error {
	name, err := pathName(r, "target")
	if err != nil {
		return err
	}
	persist, err := q.bool("persist")
	if err != nil {
		return err
	}
	force, err := q.bool("force")
	if err != nil {
		return err
	}
	return noContent(w, h.svc.DeleteTarget(r.Context(), name, DeleteOptions{Persist: persist, Force: force}))
}

func (h *handler) listLUNs(w http.ResponseWriter, r *http.Request, _ query) error {
	return byName(w, r, "target", func(ctx context.Context, target string) (LUNList, error) {
		ls, err := h.svc.ListLUNs(ctx, target)
		return LUNList{LUNs: nonNil(ls)}, err
	})
}

func (h *handler) addLUN(w http.ResponseWriter, r *http.Request, q query) error {
	target, opts, err := targetMutation(r, q)
	if err != nil {
		return err
	}
	var l config.LUN
	if err := decodeObject(w, r, "LUN", &l); err != nil {
		return err
	}
	info, err := h.svc.AddLUN(r.Context(), target, l, opts)
	return created(w, fmt.Sprintf("/v1/targets/%s/luns/%d", url.PathEscape(target), l.ID), info, err)
}

func (h *handler) removeLUN(w http.ResponseWriter, r *http.Request, q query) error {
	target, id, opts, err := lunMutation(r, q)
	if err != nil {
		return err
	}
	return noContent(w, h.svc.RemoveLUN(r.Context(), target, id, opts))
}

func (h *handler) listACLs(w http.ResponseWriter, r *http.Request, _ query) error {
	return byName(w, r, "target", func(ctx context.Context, target string) (ACLList, error) {
		as, err := h.svc.ListACLs(ctx, target)
		return ACLList{ACLs: nonNil(as)}, err
	})
}

func (h *handler) addACL(w http.ResponseWriter, r *http.Request, q query) error {
	target, opts, err := targetMutation(r, q)
	if err != nil {
		return err
	}
	var a config.ACL
	if err := decodeObject(w, r, "ACL", &a); err != nil {
		return err
	}
	info, err := h.svc.AddACL(r.Context(), target, a, opts)
	return created(w, "/v1/targets/"+url.PathEscape(target)+"/acls/"+url.PathEscape(a.Initiator.String()), info, err)
}

func (h *handler) removeACL(w http.ResponseWriter, r *http.Request, q query) error {
	target, ini, opts, err := aclMutation(r, q)
	if err != nil {
		return err
	}
	return noContent(w, h.svc.RemoveACL(r.Context(), target, ini, opts))
}

func (h *handler) listSessions(w http.ResponseWriter, r *http.Request, q query) error {
	var f SessionFilter
	if t := url.Values(q).Get("target"); t != "" {
		if !nameRE.MatchString(t) {
			return badRequest("target %q: not a target name", t)
		}
		f.Target = t
	}
	ss, err := h.svc.ListSessions(r.Context(), f)
	return ok(w, SessionList{Sessions: nonNil(ss)}, err)
}

func sessionID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if id == "" || len(id) > 256 {
		return "", badRequest("session id %q: want 1 to 256 characters", id)
	}
	return id, nil
}

func (h *handler) getSession(w http.ResponseWriter, r *http.Request, _ query) error {
	id, err := sessionID(r)
	if err != nil {
		return err
	}
	s, err := h.svc.GetSession(r.Context(), id)
	return ok(w, s, err)
}

func (h *handler) killSession(w http.ResponseWriter, r *http.Request, _ query) error {
	id, err := sessionID(r)
	if err != nil {
		return err
	}
	return noContent(w, h.svc.KillSession(r.Context(), id))
}

func (h *handler) listConnections(w http.ResponseWriter, r *http.Request, _ query) error {
	cs, err := h.svc.ListConnections(r.Context())
	return ok(w, ConnectionList{Connections: nonNil(cs)}, err)
}

func (h *handler) getConnection(w http.ResponseWriter, r *http.Request, _ query) error {
	return byName(w, r, "name", h.svc.GetConnection)
}

func (h *handler) connect(w http.ResponseWriter, r *http.Request, q query) error {
	opts, err := q.mutate()
	if err != nil {
		return err
	}
	var s config.Session
	if err := decodeObject(w, r, "session", &s); err != nil {
		return err
	}
	info, err := h.svc.Connect(r.Context(), s, opts)
	return created(w, "/v1/connections/"+url.PathEscape(s.Name), info, err)
}

func (h *handler) disconnect(w http.ResponseWriter, r *http.Request, q query) error {
	name, err := pathName(r, "name")
	if err != nil {
		return err
	}
	opts, err := q.mutate()
	if err != nil {
		return err
	}
	return noContent(w, h.svc.Disconnect(r.Context(), name, opts))
}

func (h *handler) reload(w http.ResponseWriter, r *http.Request, q query) error {
	opts, err := reloadOptions(q)
	if err != nil {
		return err
	}
	var res *ReloadResult
	if opts == (ReloadOptions{}) {
		res, err = h.svc.Reload(r.Context())
	} else {
		s, serr := h.configService()
		if serr != nil {
			return serr
		}
		res, err = s.ReloadWith(r.Context(), opts)
	}
	if res != nil && res.Changes == nil {
		res.Changes = []string{}
	}
	return ok(w, res, err)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
