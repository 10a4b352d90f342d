package admission

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeCert(t testing.TB, dir string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return pool
}

// Two replicas sharing a node's network both serve the webhook port with
// SO_REUSEPORT, over TLS with the mounted certificate.
func TestServeTLSReusePort(t *testing.T) {
	dir := t.TempDir()
	pool := writeCert(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for i := range 2 {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "replica %d", i) })
		go func() { errs <- ServeTLS(ctx, TLSServer{Address: addr, CertDir: dir, ReusePort: true}, h) }()
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, Timeout: 5 * time.Second}
	var resp *http.Response
	for range 100 {
		if resp, err = client.Post("https://"+addr+Path, "application/json", nil); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("webhook over TLS: %v", err)
	}
	_ = resp.Body.Close()
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a replica failed: %v", err)
		}
	}
	// Without the option the second listener fails.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	first := make(chan error, 1)
	go func() { first <- ServeTLS(ctx2, TLSServer{Address: addr, CertDir: dir}, http.NotFoundHandler()) }()
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ServeTLS(ctx2, TLSServer{Address: addr, CertDir: dir}, http.NotFoundHandler()); err == nil {
		t.Error("a second listener without SO_REUSEPORT succeeded")
	}
	cancel2()
	if err := <-first; err != nil {
		t.Error(err)
	}
}

func TestServeTLSWithoutCertificate(t *testing.T) {
	err := ServeTLS(context.Background(), TLSServer{Address: "127.0.0.1:0", CertDir: t.TempDir()}, http.NotFoundHandler())
	if err == nil {
		t.Fatal("served without a certificate")
	}
}
