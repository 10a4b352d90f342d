package serve

import (
	"net/http"
	"net/http/pprof"
)

// RegisterProfiling adds net/http/pprof's handlers to mux under /debug/pprof/: the
// index and named profiles (heap, goroutine, allocs, block, mutex,
// threadcreate), cmdline, a CPU profile (profile?seconds=N), symbol and an
// execution trace (trace?seconds=N). They are registered explicitly:
// importing net/http/pprof also registers them on http.DefaultServeMux,
// which no gpulink server uses. For the --profiling flag of gpulink's
// binaries (as Kubernetes components have it).
func RegisterProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
