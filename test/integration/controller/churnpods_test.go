//go:build integration

package controller_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// livePod is a pod a churn test keeps: it lives boundLife after it is
// bound, or is deleted while still pending after maxWait
// (kube-controller-manager creates the claims from templates at its own
// pace).
type livePod struct {
	created   time.Time
	boundLife time.Duration
	maxWait   time.Duration
}

// churnPods are the live pods of a churn test and what became of them.
type churnPods struct {
	live           map[string]*livePod
	boundAt        map[string]time.Time
	bound          int
	deletedPending int
}

func newChurnPods() *churnPods {
	return &churnPods{live: map[string]*livePod{}, boundAt: map[string]time.Time{}}
}

// sweep records the live pods bound since the last sweep, checking that
// each one's claims are allocated on its node, and deletes the pods whose
// time is up.
func (c *churnPods) sweep(t *testing.T, e *env, now time.Time) {
	t.Helper()
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if _, ok := c.live[p.Name]; ok && p.Spec.NodeName != "" && c.boundAt[p.Name].IsZero() {
			c.boundAt[p.Name] = now
			c.bound++
			e.checkClaimsOnNode(t, p)
		}
	}
	for name, lp := range c.live {
		b := c.boundAt[name]
		switch {
		case !b.IsZero() && now.Sub(b) > lp.boundLife:
		case b.IsZero() && now.Sub(lp.created) > lp.maxWait:
			c.deletedPending++
		default:
			continue
		}
		e.deletePod(name)
		delete(c.live, name)
	}
}

// checkClaimsOnNode fails the test unless every claim of a bound pod (from
// its status, for claims made from templates, and from its spec) is
// allocated on the pod's node: a bound pod must never lose its claim.
func (e *env) checkClaimsOnNode(t *testing.T, p *corev1.Pod) {
	t.Helper()
	var names []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names = append(names, *s.ResourceClaimName)
		}
	}
	for _, pc := range p.Spec.ResourceClaims {
		if pc.ResourceClaimName != nil {
			names = append(names, *pc.ResourceClaimName)
		}
	}
	for _, name := range names {
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		if c.Status.Allocation == nil || nodeOf(c) != p.Spec.NodeName {
			t.Errorf("pod %s bound to %s but its claim %s is allocated on %q", p.Name, p.Spec.NodeName, c.Name, nodeOf(c))
		}
	}
}
