//go:build integration

package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// faultyTransport fails a fraction of the controller's writes to claims
// and pods the way a loaded API server does: HTTP 429 without
// Retry-After (so client-go hands it to the controller), 409 conflicts,
// and timeouts after the request was sent (the write may have happened,
// the controller does not know; the error comes up to lostDelay after the
// write was applied, as a client's timeout would, which leaves other
// components time to act on the write first). Reads and events pass
// untouched. The faults are drawn from a generator seeded by the test, so
// a seed replays the same sequence of draws (which request gets which
// draw still depends on timing).
type faultyTransport struct {
	next http.RoundTripper
	// percent of matching writes to fail, per kind.
	tooMany, conflict, timeout int
	// lostDelay bounds how long a lost response keeps the caller waiting.
	lostDelay time.Duration

	mu  sync.Mutex
	rng *rand.Rand

	injected429, injected409, injectedTimeout atomic.Int32
}

// newFaultyTransport returns a faultyTransport drawing from seed.
func newFaultyTransport(seed uint64, tooMany, conflict, timeout int, lostDelay time.Duration) *faultyTransport {
	return &faultyTransport{tooMany: tooMany, conflict: conflict, timeout: timeout, lostDelay: lostDelay,
		rng: rand.New(rand.NewPCG(seed, 0x6661756c7473))}
}

func (f *faultyTransport) wrap(next http.RoundTripper) http.RoundTripper {
	f.next = next
	return f
}

// draw returns the fault percentile and the delay of a lost response.
func (f *faultyTransport) draw() (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.rng.IntN(100)
	var d time.Duration
	if f.lostDelay > 0 {
		d = time.Duration(f.rng.Int64N(int64(f.lostDelay)))
	}
	return n, d
}

func (f *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut && req.Method != http.MethodPatch {
		return f.next.RoundTrip(req)
	}
	if !strings.Contains(req.URL.Path, "/resourceclaims/") && !strings.Contains(req.URL.Path, "/pods/") {
		return f.next.RoundTrip(req)
	}
	n, delay := f.draw()
	switch {
	case n < f.tooMany:
		f.injected429.Add(1)
		return statusResponse(req, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "injected: too many requests"), nil
	case n < f.tooMany+f.conflict:
		f.injected409.Add(1)
		return statusResponse(req, http.StatusConflict, metav1.StatusReasonConflict, "injected: the object has been modified"), nil
	case n < f.tooMany+f.conflict+f.timeout:
		f.injectedTimeout.Add(1)
		resp, err := f.next.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
		}
		return nil, fmt.Errorf("injected: response lost after the request was sent: %w", context.DeadlineExceeded)
	}
	return f.next.RoundTrip(req)
}

func (f *faultyTransport) String() string {
	return fmt.Sprintf("%d x 429, %d x 409, %d timeouts", f.injected429.Load(), f.injected409.Load(), f.injectedTimeout.Load())
}

func statusResponse(req *http.Request, code int, reason metav1.StatusReason, msg string) *http.Response {
	body, _ := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg,
	})
	return &http.Response{
		StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Header:  http.Header{"Content-Type": []string{"application/json"}},
		Body:    io.NopCloser(bytes.NewReader(body)),
		Request: req, ProtoMajor: 1, ProtoMinor: 1,
	}
}
