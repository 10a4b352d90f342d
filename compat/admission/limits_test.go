package admission

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/compat"
)

// limitsServer serves the real webhook over TLS on a free port within
// limits and returns its address, a client trusting it and its metrics.
func limitsServer(t testing.TB, limits Limits) (string, *x509.CertPool, *Metrics) {
	t.Helper()
	dir := t.TempDir()
	pool := writeCert(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	m := NewMetrics(prometheus.NewRegistry())
	wh := &Webhook{Translator: &compat.Translator{Config: compat.DefaultConfig()}, Metrics: m, MaxBodyBytes: limits.MaxBodyBytes}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeTLS(ctx, TLSServer{Address: addr, CertDir: dir, Limits: limits, Metrics: m}, wh) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	})
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, pool, m
}

// slowPeer sends a review's headers announcing contentLength bytes and the
// first sent of them, then stalls: what a peer holding the webhook open
// does.
func slowPeer(t *testing.T, addr string, pool *x509.CertPool, contentLength, sent int) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", Path, contentLength); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(bytes.Repeat([]byte(" "), sent)); err != nil {
		t.Fatal(err)
	}
	return c
}

// patience is how long a test waits for the server to close a stalled
// peer: many times the read timeouts used here, so that only a server
// that does not cut peers off at all fails.
const patience = 10 * time.Second

// stallTimeout is the read timeout of the tests whose stalled peers must
// hold their slots while a review is sent: long enough for a loaded
// machine to get the review through, well under patience.
const stallTimeout = 5 * time.Second

// waitInFlight waits until the server serves n requests: the stalled
// peers' handlers start as their headers arrive, after tls.Dial returns.
// It reads the server's own gauge rather than probing on a clock, which
// a loaded machine (CI's, a parallel go test) outruns.
func waitInFlight(t *testing.T, m *Metrics, n float64) {
	t.Helper()
	for end := time.Now().Add(stallTimeout); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if testutil.ToFloat64(m.inFlight) == n {
			return
		}
	}
	t.Fatalf("gpulink_compat_requests_in_flight = %v after %s, want %v: the stalled peers' requests never all reached the handler", testutil.ToFloat64(m.inFlight), stallTimeout, n)
}

// cutOff waits for the server to end the peer's request (an answer, then
// the connection closed) and says whether it did within patience.
func cutOff(c *tls.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(patience))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("the server still held the stalled request after %s", patience)
	}
	return nil
}

// admissionBody is a review of a pod without GPUs, which the webhook
// allows.
func admissionBody(t *testing.T) []byte {
	t.Helper()
	raw, err := json.Marshal(gpuPod("plain", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "team", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func post(t *testing.T, addr string, pool *x509.CertPool, body []byte) int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}, Timeout: patience}
	resp, err := client.Post("https://"+addr+Path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("posting a review: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// Peers that send headers and most of a body and then stall are cut off
// once the read timeout has passed, which frees what they sent; the old
// server (a header timeout only) held them as long as they stayed.
func TestWebhookCutsOffStalledBodies(t *testing.T) {
	addr, pool, _ := limitsServer(t, Limits{ReadTimeout: 300 * time.Millisecond, MaxBodyBytes: 1 << 20, MaxInFlight: 8, MaxBufferedBytes: 8 << 20})
	var peers []*tls.Conn
	for range 8 {
		peers = append(peers, slowPeer(t, addr, pool, 1<<20, 900<<10))
	}
	for i, c := range peers {
		start := time.Now()
		if err := cutOff(c); err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
		t.Logf("peer %d cut off after %s more", i, time.Since(start).Round(time.Millisecond))
	}
	// The server serves on.
	if code := post(t, addr, pool, admissionBody(t)); code != http.StatusOK {
		t.Errorf("a review after the stalled peers: HTTP %d, want 200", code)
	}
}

// At most MaxInFlight requests are served at once: while stalled peers
// hold every slot a review is answered 429 at once (not queued), and once
// they are cut off reviews are served again.
func TestWebhookCapsConcurrentRequests(t *testing.T) {
	addr, pool, m := limitsServer(t, Limits{ReadTimeout: stallTimeout, MaxBodyBytes: 1 << 20, MaxInFlight: 4, MaxBufferedBytes: 8 << 20})
	var peers []*tls.Conn
	for range 4 {
		peers = append(peers, slowPeer(t, addr, pool, 1<<20, 1<<10))
	}
	body := admissionBody(t)
	waitInFlight(t, m, 4)
	if code := post(t, addr, pool, body); code != http.StatusTooManyRequests {
		t.Fatalf("4 stalled peers holding every slot of MaxInFlight 4 and a review: HTTP %d, want 429", code)
	}
	if n := testutil.ToFloat64(m.refused.WithLabelValues("in-flight")); n < 1 {
		t.Errorf("gpulink_compat_requests_refused_total{reason=in-flight} = %v, want at least 1", n)
	}
	for i, c := range peers {
		if err := cutOff(c); err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
	}
	waitInFlight(t, m, 0)
	if code := post(t, addr, pool, body); code != http.StatusOK {
		t.Errorf("a review once the peers were cut off: HTTP %d, want 200", code)
	}
}

// Bodies over MaxBodyBytes are refused from their Content-Length, before
// any is read; the bytes of bodies under way are bounded by
// MaxBufferedBytes (a request without Content-Length reserves
// MaxBodyBytes).
func TestWebhookBoundsBufferedBytes(t *testing.T) {
	addr, pool, m := limitsServer(t, Limits{ReadTimeout: stallTimeout, MaxBodyBytes: 1 << 20, MaxInFlight: 16, MaxBufferedBytes: 2 << 20})
	big := slowPeer(t, addr, pool, 4<<20, 0)
	line, err := bufio.NewReader(big).ReadString('\n')
	if err != nil {
		t.Fatalf("a 4 MiB review: %v", err)
	}
	if want := "HTTP/1.1 413"; len(line) < len(want) || line[:len(want)] != want {
		t.Errorf("a 4 MiB review: %q, want 413", line)
	}
	// Two stalled 1 MiB bodies fill the 2 MiB.
	peers := []*tls.Conn{slowPeer(t, addr, pool, 1<<20, 1<<10), slowPeer(t, addr, pool, 1<<20, 1<<10)}
	waitInFlight(t, m, 2)
	if code := post(t, addr, pool, admissionBody(t)); code != http.StatusTooManyRequests {
		t.Fatalf("two stalled 1 MiB bodies filling MaxBufferedBytes 2 MiB and a review: HTTP %d, want 429", code)
	}
	if n := testutil.ToFloat64(m.refused.WithLabelValues("memory")); n < 1 {
		t.Errorf("gpulink_compat_requests_refused_total{reason=memory} = %v, want at least 1", n)
	}
	if n := testutil.ToFloat64(m.refused.WithLabelValues("too-large")); n != 1 {
		t.Errorf("gpulink_compat_requests_refused_total{reason=too-large} = %v, want 1", n)
	}
	for i, c := range peers {
		if err := cutOff(c); err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := (Limits{MaxBodyBytes: 4 << 20, MaxBufferedBytes: 2 << 20}).Validate(); err == nil {
		t.Error("a body limit over the buffered bytes was accepted")
	}
	if err := DefaultLimits.Validate(); err != nil {
		t.Error(err)
	}
}

// BenchmarkReviewMemory reports the bytes allocated to answer one review
// of a pod near etcd's size limit (1.5 MiB, mostly environment strings),
// per byte of review: the factor by which MaxBufferedBytes bounds the
// webhook's memory for requests.
func BenchmarkReviewMemory(b *testing.B) {
	pod := gpuPod("big", map[string]string{"nvidia.com/gpu": "1"})
	for i := range 1500 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: strings.Repeat("x", 1000)})
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "team", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		b.Fatal(err)
	}
	wh := &Webhook{Translator: &compat.Translator{Config: compat.DefaultConfig()}}
	var ms0, ms1 goruntime.MemStats
	goruntime.ReadMemStats(&ms0)
	b.ResetTimer()
	for b.Loop() {
		rec := httptest.NewRecorder()
		wh.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
		if rec.Code != http.StatusOK {
			b.Fatalf("HTTP %d", rec.Code)
		}
	}
	b.StopTimer()
	goruntime.ReadMemStats(&ms1)
	b.ReportMetric(float64(len(body)), "review-bytes")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(b.N)/float64(len(body)), "alloc/review-byte")
}

// procStatusMiB reads a field of /proc/self/status (VmRSS, VmHWM) in MiB.
func procStatusMiB(b *testing.B, field string) float64 {
	b.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kib float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kib); err != nil {
				b.Fatalf("%s: %v", line, err)
			}
			return kib / 1024
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// BenchmarkWebhookHeldOpen loads the webhook on a real TLS listener as a
// hostile peer and a busy API server would at once: 64 peers that announce
// a 2 MiB review, send 1.9 MiB of it and stall, and 32 clients posting
// reviews of a pod near etcd's size limit (1.5 MiB) in a loop, until the
// stalled peers are cut off. It reports the process's peak RSS over its
// RSS before (VmHWM, reset through /proc/self/clear_refs), with the
// default limits (limits; a 1 s read timeout to keep it short) and with
// the old server's (unbounded: 8 MiB bodies, no read timeout, no caps;
// the stalled peers are closed by the benchmark after 5 s).
func BenchmarkWebhookHeldOpen(b *testing.B) {
	pod := gpuPod("big", map[string]string{"nvidia.com/gpu": "1"})
	for i := range 1500 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: strings.Repeat("x", 1000)})
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "team", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		limits Limits
		hold   time.Duration
	}{
		{"limits", Limits{ReadTimeout: time.Second, MaxBodyBytes: DefaultLimits.MaxBodyBytes, MaxInFlight: DefaultLimits.MaxInFlight, MaxBufferedBytes: DefaultLimits.MaxBufferedBytes}, 0},
		{"unbounded", Limits{ReadTimeout: time.Hour, MaxBodyBytes: 8 << 20, MaxInFlight: 1 << 20, MaxBufferedBytes: 1 << 40}, 5 * time.Second},
	} {
		b.Run(tc.name, func(b *testing.B) {
			addr, pool, _ := limitsServer(b, tc.limits)
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 32}, Timeout: patience}
			goruntime.GC()
			if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
				b.Skipf("cannot reset VmHWM: %v", err)
			}
			before := procStatusMiB(b, "VmRSS")
			codes := map[int]int{}
			var mu sync.Mutex
			for b.Loop() {
				peers := make([]*tls.Conn, 64)
				for i := range peers {
					c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
					if err != nil {
						b.Fatal(err)
					}
					fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", Path, 2<<20)
					_, _ = c.Write(bytes.Repeat([]byte(" "), 1900<<10))
					peers[i] = c
				}
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range 32 {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							resp, err := client.Post("https://"+addr+Path, "application/json", bytes.NewReader(body))
							if err != nil {
								continue
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							_ = resp.Body.Close()
							mu.Lock()
							codes[resp.StatusCode]++
							mu.Unlock()
						}
					})
				}
				if tc.hold > 0 {
					time.Sleep(tc.hold)
					for _, c := range peers {
						_ = c.Close()
					}
				} else {
					for _, c := range peers {
						if err := cutOff(c); err != nil {
							b.Error(err)
						}
						_ = c.Close()
					}
				}
				close(stop)
				wg.Wait()
			}
			b.ReportMetric(procStatusMiB(b, "VmHWM")-before, "peak-rss-growth-MiB")
			b.ReportMetric(float64(codes[http.StatusOK]), "answered")
			b.ReportMetric(float64(codes[http.StatusTooManyRequests]), "refused-429")
			client.CloseIdleConnections()
		})
	}
}
