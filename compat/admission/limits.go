package admission

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"
)

// Limits bound what the webhook's peers can hold. Anyone who reaches the
// webhook's port may call it (the API server is not authenticated), and
// every controller replica serves it, the leader included: a peer must not
// be able to fill the controller's memory or keep its handlers busy.
type Limits struct {
	// ReadTimeout bounds a request from its first byte to its body's
	// last; the peer's connection is closed then, and whatever it sent is
	// freed. The API server sends a review at once, over the control
	// plane's network, and gives up on the webhook after timeoutSeconds
	// (chart: 10 s) anyway.
	ReadTimeout time.Duration
	// MaxBodyBytes bounds one AdmissionReview: a larger one is refused
	// (413) before a byte of its body is read when its Content-Length says
	// so, and after MaxBodyBytes otherwise.
	MaxBodyBytes int64
	// MaxInFlight bounds the requests being read, decoded and answered at
	// once; more are answered 429 at once.
	MaxInFlight int
	// MaxBufferedBytes bounds the bodies being read and decoded at once:
	// a request reserves its Content-Length (MaxBodyBytes when it sends
	// none) for as long as it is served, and one that does not fit is
	// answered 429 at once. The webhook's memory for requests is about
	// three times this (the body, the decoded review and the decoded pod;
	// BenchmarkReviewMemory).
	MaxBufferedBytes int64
}

// DefaultLimits are the webhook's limits unless flags say otherwise.
//
// MaxBodyBytes is 2 MiB: the review carries one pod (CREATE only), and a
// pod larger than etcd's default request limit (1.5 MiB, --max-request-bytes)
// cannot be stored at all; its JSON plus the review's envelope (user info,
// kind, options: under 4 KiB) stays under 2 MiB unless its strings are
// mostly escaped characters. A pod of a GPU workload is 2-20 KiB
// (TestReviewSizes). 8 MiB, the old bound, admitted bodies four times
// what any storable pod needs.
//
// MaxBufferedBytes is 16 MiB: eight reviews of the largest size, or all
// MaxInFlight requests of pods up to 256 KiB, at once. Bounded by it the
// webhook holds at most about 50 MiB for requests (measured:
// TestWebhookHeldOpenBounded in test/integration/compat).
//
// MaxInFlight is 64: a review is answered in well under a millisecond of
// CPU, so 64 at once is far more than the API server sends; it bounds the
// goroutines a peer can keep busy.
var DefaultLimits = Limits{ReadTimeout: 5 * time.Second, MaxBodyBytes: 2 << 20, MaxInFlight: 64, MaxBufferedBytes: 16 << 20}

// withDefaults fills unset fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = DefaultLimits.ReadTimeout
	}
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultLimits.MaxBodyBytes
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = DefaultLimits.MaxInFlight
	}
	if l.MaxBufferedBytes <= 0 {
		l.MaxBufferedBytes = DefaultLimits.MaxBufferedBytes
	}
	return l
}

// Validate says which limit is unusable.
func (l Limits) Validate() error {
	if l.MaxBufferedBytes > 0 && l.MaxBodyBytes > l.MaxBufferedBytes {
		return fmt.Errorf("webhook limits: MaxBodyBytes %d exceeds MaxBufferedBytes %d, so a review of the largest size could never be served", l.MaxBodyBytes, l.MaxBufferedBytes)
	}
	return nil
}

// limiter refuses requests beyond Limits before their body is read.
type limiter struct {
	limits   Limits
	inFlight chan struct{}
	bytes    *semaphore.Weighted
	next     http.Handler
	metrics  *Metrics
}

func newLimiter(l Limits, next http.Handler, m *Metrics) *limiter {
	l = l.withDefaults()
	return &limiter{limits: l, inFlight: make(chan struct{}, l.MaxInFlight), bytes: semaphore.NewWeighted(l.MaxBufferedBytes), next: next, metrics: m}
}

// ServeHTTP serves the request within the limits, or answers 413 or 429
// without reading its body. Waiting for room instead would let a peer
// queue goroutines and connections without bound; the API server's
// failurePolicy decides what a refused pod gets.
func (l *limiter) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.ContentLength > l.limits.MaxBodyBytes {
		l.metrics.refuse("too-large")
		http.Error(rw, fmt.Sprintf("the AdmissionReview's Content-Length %d exceeds the webhook's limit of %d bytes", r.ContentLength, l.limits.MaxBodyBytes), http.StatusRequestEntityTooLarge)
		return
	}
	select {
	case l.inFlight <- struct{}{}:
		l.metrics.serving(1)
		defer func() {
			l.metrics.serving(-1)
			<-l.inFlight
		}()
	default:
		l.metrics.refuse("in-flight")
		tooMany(rw, fmt.Sprintf("the webhook is serving %d requests, its limit", l.limits.MaxInFlight))
		return
	}
	reserve := l.limits.MaxBodyBytes
	if r.ContentLength >= 0 {
		reserve = r.ContentLength
	}
	if !l.bytes.TryAcquire(reserve) {
		l.metrics.refuse("memory")
		tooMany(rw, fmt.Sprintf("the webhook is reading %d bytes of requests at most at once, and %d more do not fit", l.limits.MaxBufferedBytes, reserve))
		return
	}
	defer l.bytes.Release(reserve)
	r.Body = http.MaxBytesReader(rw, r.Body, l.limits.MaxBodyBytes)
	l.next.ServeHTTP(rw, r)
}

func tooMany(rw http.ResponseWriter, msg string) {
	rw.Header().Set("Retry-After", strconv.Itoa(1))
	http.Error(rw, msg+": retry", http.StatusTooManyRequests)
}
