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

// TLSServer says where and how the webhook is served.
type TLSServer struct {
	Address string
	// CertDir holds tls.crt and tls.key.
	CertDir string
	// ReusePort sets SO_REUSEPORT, so that replicas sharing a node's
	// network (hostNetwork) all serve the port and the kernel spreads
	// connections over them; it needs the same user for all of them.
	ReusePort bool
	// Limits bound what peers can hold (zero fields: DefaultLimits).
	Limits Limits
	// Metrics counts the requests the limits refuse; nil: not counted.
	Metrics *Metrics
}

// webhookIdleTimeout keeps the API server's connections open between
// calls (it reuses them) without keeping idle peers forever.
const webhookIdleTimeout = 90 * time.Second

// ServeTLS serves h under Path with the certificate in s.CertDir until ctx
// ends, within s.Limits. The certificate is checked before listening so a
// missing Secret fails the start with a clear error.
func ServeTLS(ctx context.Context, s TLSServer, h http.Handler) error {
	limits := s.Limits.withDefaults()
	if err := limits.Validate(); err != nil {
		return err
	}
	cr := &certReloader{dir: s.CertDir}
	if _, err := cr.get(nil); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(Path, newLimiter(limits, h, s.Metrics))
	klog.FromContext(ctx).Info("Serving the translation webhook", "address", s.Address, "path", Path,
		"readTimeout", limits.ReadTimeout, "maxBodyBytes", limits.MaxBodyBytes, "maxInFlight", limits.MaxInFlight, "maxBufferedBytes", limits.MaxBufferedBytes)
	return serve.Serve(ctx, s.Address, mux, serve.Options{Name: "webhook", ReusePort: s.ReusePort,
		ReadTimeout: limits.ReadTimeout, IdleTimeout: webhookIdleTimeout,
		// Counted from the end of the headers: the body, the review and the answer.
		WriteTimeout: 2 * limits.ReadTimeout,
		// The API server sends a few hundred bytes of headers.
		MaxHeaderBytes: 64 << 10,
		TLS:            &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cr.get}})
}
