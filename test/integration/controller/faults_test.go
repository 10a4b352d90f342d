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
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// faultyTransport fails a fraction of the controller's writes to claims
// and pods the way a loaded API server does: HTTP 429 without
// Retry-After (so client-go hands it to the controller), 409 conflicts,
// and timeouts after the request was sent (the write may have happened,
// the controller does not know). Reads and events pass untouched.
type faultyTransport struct {
	next http.RoundTripper
	// percent of matching writes to fail, per kind.
	tooMany, conflict, timeout int

	injected429, injected409, injectedTimeout atomic.Int32
}

func (f *faultyTransport) wrap(next http.RoundTripper) http.RoundTripper {
	f.next = next
	return f
}

func (f *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut && req.Method != http.MethodPatch {
		return f.next.RoundTrip(req)
	}
	if !strings.Contains(req.URL.Path, "/resourceclaims/") && !strings.Contains(req.URL.Path, "/pods/") {
		return f.next.RoundTrip(req)
	}
	n := rand.IntN(100)
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
