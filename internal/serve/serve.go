// Package serve is the one place gpulink's binaries serve HTTP from: the
// controller's and the kubelet plugin's metrics and health endpoints, the
// translation webhook's TLS server, and Go's runtime profiles behind
// --profiling. Timeouts and the graceful shutdown are set here, once.
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

const (
	// readHeaderTimeout bounds how long a client may take to send its
	// request headers (a slow client cannot hold connections open).
	readHeaderTimeout = 10 * time.Second
	// shutdownTimeout is how long requests under way get to finish once
	// the server's context ends.
	shutdownTimeout = 5 * time.Second
)

// Options shape a server.
type Options struct {
	// Name names the server in logs and errors ("metrics", "webhook").
	Name string
	// TLS, when set, serves HTTPS with it (its certificates or
	// GetCertificate); otherwise plain HTTP.
	TLS *tls.Config
	// ReusePort sets SO_REUSEPORT on the socket, so that replicas sharing
	// a node's network (hostNetwork) all serve the port and the kernel
	// spreads connections over them.
	ReusePort bool
	// ReadTimeout, when set, bounds the time from a request's first byte
	// to its body's last (http.Server.ReadTimeout): the header timeout
	// alone lets a peer that sent headers hold the handler, and whatever
	// it buffered, for as long as it trickles the body. The header
	// timeout is then the smaller of the two.
	ReadTimeout time.Duration
	// WriteTimeout, when set, bounds the time to write a response, so a
	// peer that does not read its answer cannot hold the handler either.
	WriteTimeout time.Duration
	// IdleTimeout, when set, is how long a kept-alive connection may wait
	// for its next request (without it, net/http uses ReadTimeout, which
	// would close the API server's reused connections between calls).
	IdleTimeout time.Duration
	// MaxHeaderBytes, when set, replaces net/http's 1 MiB default.
	MaxHeaderBytes int
}

// Serve serves h on addr until ctx ends, then shuts the server down,
// giving requests under way shutdownTimeout to finish. A listen error is
// returned at once.
func Serve(ctx context.Context, addr string, h http.Handler, o Options) error {
	var lc net.ListenConfig
	if o.ReusePort {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", o.Name, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, TLSConfig: o.TLS,
		ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, IdleTimeout: o.IdleTimeout, MaxHeaderBytes: o.MaxHeaderBytes}
	if o.ReadTimeout > 0 && o.ReadTimeout < readHeaderTimeout {
		srv.ReadHeaderTimeout = o.ReadTimeout
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	klog.FromContext(ctx).Info("Serving", "server", o.Name, "address", ln.Addr().String(), "tls", o.TLS != nil)
	if o.TLS != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: serving on %s: %w", o.Name, addr, err)
	}
	return nil
}

// Metrics returns a mux serving the registry in the Prometheus format
// under /metrics and, with profiling (--profiling), Go's runtime profiles
// under /debug/pprof/. Callers may add their own endpoints to it.
func Metrics(reg *prometheus.Registry, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if profiling {
		RegisterProfiling(mux)
	}
	return mux
}

// Health returns a mux serving /healthz (live: nil or nil error is
// healthy, an error is a 500 with its message) and /readyz (ready: nil or
// true is ready, false a 503 saying the caches are not synced).
func Health(live func(*http.Request) error, ready func() bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if live != nil {
			if err := live(r); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "informer caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
