package admission

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpulink/gpulink/internal/serve"
	"k8s.io/klog/v2"
)

// certReloader serves the newest tls.crt/tls.key of a directory, so a
// rotated Secret (mounted files change) is picked up without a restart.
type certReloader struct {
	dir     string
	mu      sync.Mutex
	modTime time.Time
	cert    *tls.Certificate
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	crt, key := filepath.Join(c.dir, "tls.crt"), filepath.Join(c.dir, "tls.key")
	st, err := os.Stat(crt)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && st.ModTime().Equal(c.modTime) {
		return c.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	c.cert, c.modTime = &pair, st.ModTime()
	return c.cert, nil
}

// ServeTLS serves the webhook on addr with the certificate in certDir
// (tls.crt, tls.key) until ctx ends. The certificate is checked before
// listening so a missing Secret fails the start with a clear error.
// reusePort sets SO_REUSEPORT, so that replicas sharing a node's network
// (hostNetwork) all serve the port and the kernel spreads connections
// over them; it needs the same user for all of them.
func ServeTLS(ctx context.Context, addr, certDir string, reusePort bool, h http.Handler) error {
	cr := &certReloader{dir: certDir}
	if _, err := cr.get(nil); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(Path, h)
	klog.FromContext(ctx).Info("Serving the translation webhook", "address", addr, "path", Path)
	return serve.Serve(ctx, addr, mux, serve.Options{Name: "webhook", ReusePort: reusePort,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cr.get}})
}
