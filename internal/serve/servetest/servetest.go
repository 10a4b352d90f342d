// Package servetest checks, in the tests of gpulink's binaries, that
// a server's handler serves the runtime profiles exactly when --profiling
// is on.
package servetest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Get serves one GET request on h and returns the status and body.
func Get(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// CheckServed fails t unless h serves /debug/pprof/ (index, a named
// profile, cmdline) when profiling is on, and answers 404 when it is off.
func CheckServed(t testing.TB, h http.Handler, profiling bool) {
	t.Helper()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
		code, body := Get(h, path)
		switch {
		case profiling && code != http.StatusOK:
			t.Errorf("profiling on: %s = %d %.200q, want 200", path, code, body)
		case !profiling && code != http.StatusNotFound:
			t.Errorf("profiling off: %s = %d, want 404", path, code)
		}
	}
}
