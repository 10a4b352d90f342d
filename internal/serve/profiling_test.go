package serve

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRegisterProfiling(t *testing.T) {
	mux := http.NewServeMux()
	RegisterProfiling(mux)
	for path, want := range map[string]string{
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile",
		"/debug/pprof/cmdline":           "",
		"/debug/pprof/heap?debug=1":      "heap profile",
		"/debug/pprof/profile?seconds=1": "",
		"/debug/pprof/symbol":            "num_symbols",
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s = %d, body %.200q; want 200 with %q", path, rec.Code, rec.Body.String(), want)
		}
	}
}
