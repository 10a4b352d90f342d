package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of the cluster's keys and certificates.
type pki struct {
	caCert, caKey                       string
	apiserverCert, apiserverKey         string
	kubeletClientCert, kubeletClientKey string
	saKey, saPub                        string
	tokenFile                           string
	caPEM                               []byte
	adminToken, nodeToken               string
}

// writePKI creates a CA, the API server's serving certificate, the API
// server's client certificate for kubelets, a service account key pair and a
// static token file with an admin (system:masters) and a node token.
func writePKI(dir, nodeName string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating PKI directory: %w", err)
	}
	p := &pki{
		caCert:            filepath.Join(dir, "ca.crt"),
		caKey:             filepath.Join(dir, "ca.key"),
		apiserverCert:     filepath.Join(dir, "apiserver.crt"),
		apiserverKey:      filepath.Join(dir, "apiserver.key"),
		kubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		kubeletClientKey:  filepath.Join(dir, "apiserver-kubelet-client.key"),
		saKey:             filepath.Join(dir, "sa.key"),
		saPub:             filepath.Join(dir, "sa.pub"),
		tokenFile:         filepath.Join(dir, "tokens.csv"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpulink-localcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := os.WriteFile(p.caCert, p.caPEM, 0o644); err != nil {
		return nil, fmt.Errorf("writing CA certificate: %w", err)
	}
	if err := writeKey(p.caKey, caKey); err != nil {
		return nil, err
	}

	issue := func(certPath, keyPath string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generating key for %s: %w", tmpl.Subject.CommonName, err)
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now.Add(-time.Hour)
		tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("creating certificate for %s: %w", tmpl.Subject.CommonName, err)
		}
		if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return fmt.Errorf("writing certificate for %s: %w", tmpl.Subject.CommonName, err)
		}
		return writeKey(keyPath, key)
	}
	if err := issue(p.apiserverCert, p.apiserverKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	}); err != nil {
		return nil, err
	}
	if err := issue(p.kubeletClientCert, p.kubeletClientKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating service account key: %w", err)
	}
	if err := writeKey(p.saKey, saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding service account public key: %w", err)
	}
	if err := os.WriteFile(p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return nil, fmt.Errorf("writing service account public key: %w", err)
	}

	p.adminToken = randomHex(32)
	p.nodeToken = randomHex(32)
	tokens := fmt.Sprintf("%s,admin,uid-admin,\"system:masters\"\n%s,system:node:%s,uid-node-%s,\"system:nodes\"\n",
		p.adminToken, p.nodeToken, nodeName, nodeName)
	if err := os.WriteFile(p.tokenFile, []byte(tokens), 0o600); err != nil {
		return nil, fmt.Errorf("writing token file: %w", err)
	}
	return p, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("writing key %s: %w", filepath.Base(path), err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("reading random serial number: %v", err))
	}
	return n
}

func randomHex(n int) string {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err))
	}
	return hex.EncodeToString(b)
}
