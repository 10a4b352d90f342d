package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// explainOptions are the flags of `explain`.
type explainOptions struct {
	inspectOptions
	namespace string
	// events caps the events shown, newest kept.
	events int
}

// explainClock is the clock of event ages; tests set it.
var explainClock = time.Now

// namespaceFunc returns the namespace of the kubeconfig's context, the
// default when -n is not given. A parameter so tests need no kubeconfig.
type namespaceFunc func(o *inspectOptions) string

func newExplainCommand(prog string) *cobra.Command {
	return newExplainCommandWith(prog, kubeconfigClient, kubeconfigNamespace)
}

func newExplainCommandWith(prog string, newClient clientFactory, defaultNamespace namespaceFunc) *cobra.Command {
	o := &explainOptions{inspectOptions: inspectOptions{output: outputTable}, events: 8}
	cmd := &cobra.Command{
		Use:   "explain POD",
		Short: "Explain why a pod got its GPUs, or why it waits for them",
		Long: `Show on one screen why gpulink gave a pod its GPUs or why the pod still
waits: the pod's gpulink claims and their allocation (devices, node, the link
class of the set against the best the node has for that many GPUs), the
node's GPUs, the controller's decision as its events record it (the nodes
that also fit and those passed over, or why nothing fits), and the pod's
latest events.

Needs permission to get pods, resourceclaims and resourceslices and to list
events in the pod's namespace.`,
		Example: "  " + prog + " explain trainer-0\n" +
			"  " + prog + " explain -n team-a trainer-0",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.namespace == "" {
				o.namespace = defaultNamespace(&o.inspectOptions)
			}
			if o.events < 0 {
				return usageError{fmt.Errorf("--events must not be negative, got %d", o.events)}
			}
			client, server, err := newClient(&o.inspectOptions)
			if err != nil {
				return err
			}
			ex, err := gatherExplanation(cmd.Context(), client, server, o.namespace, args[0])
			if err != nil {
				return err
			}
			return writeExplanation(cmd.OutOrStdout(), ex, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	f.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	f.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "time limit for each API request (0: none)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the pod (default: the kubeconfig context's)")
	f.IntVar(&o.events, "events", o.events, "show at most this many of the pod's latest events")
	return cmd
}

// kubeconfigNamespace is the namespace of the kubeconfig context, as
// kubectl uses it; "default" when none is set or the kubeconfig is broken
// (connecting reports that then).
func kubeconfigNamespace(o *inspectOptions) string {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).Namespace()
	if err != nil || ns == "" {
		return metav1.NamespaceDefault
	}
	return ns
}

// explanation is everything explain shows about one pod.
type explanation struct {
	Pod    *corev1.Pod
	Claims []claimExplanation
	// Nodes are the reports of the nodes the claims are allocated on.
	Nodes map[string]report.Node
	// Events are the pod's events, oldest first.
	Events []corev1.Event
}

// claimExplanation is one claim of the pod.
type claimExplanation struct {
	PodClaim string
	Name     string
	Claim    *resourceapi.ResourceClaim
	// Missing says why there is no claim object to show.
	Missing string
}

func gatherExplanation(ctx context.Context, client kubernetes.Interface, server, ns, name string) (*explanation, error) {
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("pod %s/%s not found at %s", ns, name, server)
	}
	if err != nil {
		return nil, apiError("get pod "+ns+"/"+name, server, err)
	}
	ex := &explanation{Pod: pod, Nodes: map[string]report.Node{}}
	pools := map[string]bool{}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		ce := claimExplanation{PodClaim: pc.Name}
		claimName, _, err := resourceclaim.Name(pod, pc)
		switch {
		case err != nil:
			ce.Missing = "not created yet (" + err.Error() + ")"
		case claimName == nil:
			ce.Missing = "not needed (the template was left out for this pod)"
		default:
			ce.Name = *claimName
			c, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, *claimName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				ce.Missing = "does not exist"
			case err != nil:
				return nil, apiError("get ResourceClaim "+ns+"/"+*claimName, server, err)
			default:
				ce.Claim = c
				for _, r := range gpulinkResults(c) {
					pools[r.Pool] = true
				}
			}
		}
		ex.Claims = append(ex.Claims, ce)
	}
	if len(pools) > 0 {
		published, err := listResourceSlices(ctx, client)
		if err != nil {
			return nil, apiError("list ResourceSlices of driver "+driver.Name, server, err)
		}
		var mine []*resourceapi.ResourceSlice
		for _, s := range published {
			if pools[s.Spec.Pool.Name] {
				mine = append(mine, s)
			}
		}
		var held []*resourceapi.ResourceClaim
		for _, ce := range ex.Claims {
			if ce.Claim != nil {
				held = append(held, ce.Claim)
			}
		}
		for _, r := range report.Build(mine, held) {
			ex.Nodes[r.Pool] = r
		}
	}
	events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
	})
	if err != nil {
		return nil, apiError("list events of pod "+ns+"/"+name, server, err)
	}
	for _, e := range events.Items {
		// Filtered again: not every server (or fake) applies the selector.
		if e.InvolvedObject.UID == pod.UID {
			ex.Events = append(ex.Events, e)
		}
	}
	slices.SortStableFunc(ex.Events, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	return ex, nil
}

// gpulinkResults are the claim's allocation results of gpulink devices.
func gpulinkResults(c *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == driver.Name {
			out = append(out, r)
		}
	}
	return out
}

// eventTime is when an event last happened, whichever API wrote it.
func eventTime(e corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// isControllerEvent tells whether the gpulink controller recorded e.
func isControllerEvent(e corev1.Event) bool {
	return e.ReportingController == "gpulink-controller" || e.Source.Component == "gpulink-controller"
}

func writeExplanation(w io.Writer, ex *explanation, o *explainOptions) error {
	// One tabwriter: only the event rows have tabs, so only they align.
	p := &errWriter{w: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	pod := ex.Pod
	p.printf("Pod %s/%s: %s\n", pod.Namespace, pod.Name, podState(ex))
	if len(ex.Claims) == 0 {
		p.printf("  The pod has no resource claims: gpulink has nothing to do with it.\n")
	}
	if len(ex.Claims) > 0 {
		p.printf("\nClaims:\n")
	}
	for _, ce := range ex.Claims {
		writeClaim(p, ex, ce)
	}
	var nodes []string
	for pool := range ex.Nodes {
		nodes = append(nodes, pool)
	}
	slices.Sort(nodes)
	for _, pool := range nodes {
		r := ex.Nodes[pool]
		p.printf("\n%s\n", nodeSummary(r))
		if products := productsOf(r); products != "" {
			p.printf("  GPUs: %s\n", products)
		}
	}
	var decision *corev1.Event
	for i := range ex.Events {
		e := ex.Events[i]
		if isControllerEvent(e) && e.Reason != report.ReasonGateRemoved {
			decision = &ex.Events[i]
		}
	}
	p.printf("\nDecision (gpulink controller):\n")
	if decision == nil {
		p.printf("  none recorded (is the gpulink controller running, and the pod gated by it?)\n")
	} else {
		p.printf("  %s %s: %s\n", decision.Reason, age(explainClock(), eventTime(*decision)), decision.Message)
	}
	events := ex.Events
	if len(events) > o.events {
		events = events[len(events)-o.events:]
	}
	if len(events) > 0 {
		p.printf("\nEvents (latest %d, oldest first):\n", len(events))
		p.printf("  AGE\tTYPE\tREASON\tFROM\tMESSAGE\n")
		for _, e := range events {
			from := e.ReportingController
			if from == "" {
				from = e.Source.Component
			}
			p.printf("  %s\t%s\t%s\t%s\t%s\n", age(explainClock(), eventTime(e)), e.Type, e.Reason, orDash(from), oneLine(e.Message))
		}
	}
	p.flush()
	return p.err
}

// podState is the one-line verdict of the header.
func podState(ex *explanation) string {
	pod := ex.Pod
	allocated, pending := 0, 0
	for _, ce := range ex.Claims {
		if ce.Claim != nil && ce.Claim.Status.Allocation != nil {
			allocated++
		} else {
			pending++
		}
	}
	gated := slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == driver.SchedulingGate })
	var s string
	switch {
	case len(ex.Claims) == 0:
		s = "no claims"
	case pending == 0:
		s = "GPUs allocated"
	case allocated == 0:
		s = "waiting for GPUs"
	default:
		s = fmt.Sprintf("waiting for GPUs (%d of %d claims allocated)", allocated, len(ex.Claims))
	}
	switch {
	case gated:
		s += ", held back by the scheduling gate " + driver.SchedulingGate
	case pod.Spec.NodeName != "":
		s += ", running on node " + pod.Spec.NodeName + " (phase " + string(pod.Status.Phase) + ")"
	default:
		s += ", handed to kube-scheduler, not bound yet"
	}
	return s
}

func writeClaim(p *errWriter, ex *explanation, ce claimExplanation) {
	label := ce.PodClaim
	if ce.Name != "" {
		label += " (ResourceClaim " + ce.Name + ")"
	}
	if ce.Claim == nil {
		p.printf("  %s: %s\n", label, ce.Missing)
		return
	}
	c := ce.Claim
	if c.Status.Allocation == nil {
		p.printf("  %s: not allocated\n", label)
		return
	}
	results := gpulinkResults(c)
	if len(results) == 0 {
		p.printf("  %s: allocated, no gpulink devices\n", label)
		return
	}
	pool := results[0].Pool
	reserved := "not reserved for this pod"
	for _, r := range c.Status.ReservedFor {
		if r.UID == ex.Pod.UID {
			reserved = "reserved for this pod"
		}
	}
	p.printf("  %s: allocated on node %s, %s\n", label, pool, reserved)
	byRequest := map[string][]resourceapi.DeviceRequestAllocationResult{}
	var order []string
	for _, r := range results {
		if _, ok := byRequest[r.Request]; !ok {
			order = append(order, r.Request)
		}
		byRequest[r.Request] = append(byRequest[r.Request], r)
	}
	report, haveNode := ex.Nodes[pool]
	for _, req := range order {
		rs := byRequest[req]
		var names []string
		shares := 0
		for _, r := range rs {
			names = append(names, r.Device)
			if r.ShareID != nil {
				shares++
			}
		}
		line := fmt.Sprintf("    request %s: %s", req, strings.Join(names, ", "))
		switch {
		case slices.ContainsFunc(rs, func(r resourceapi.DeviceRequestAllocationResult) bool {
			return driver.IsMIGDeviceName(r.Device) || driver.IsPartitionDeviceName(r.Device)
		}):
			line += " (" + migVerdict(report, rs) + ")"
		case shares > 0:
			for _, r := range rs {
				mem, cores := r.ConsumedCapacity[driver.CapacityMemory], r.ConsumedCapacity[driver.CapacityCores]
				line += fmt.Sprintf(" (a share: %s memory, %s cores)", mem.String(), cores.String())
			}
		case len(rs) == 1:
			line += " (one whole GPU)"
		case haveNode && report.Topology != nil:
			line += " (whole GPUs): " + linkVerdict(report.Topology, rs)
		default:
			line += " (whole GPUs)"
		}
		p.printf("%s\n", line)
	}
}

// migVerdict names the MIG devices of a request by profile and parent GPU,
// as the node's report knows them: "MIG device 1g.5gb of gpu-0", and a
// partition of a GPU partitioned on demand by its placement too:
// "partition 1g.5gb at memory slice 6 of gpu-0".
func migVerdict(r report.Node, rs []resourceapi.DeviceRequestAllocationResult) string {
	parts := make([]string, 0, len(rs))
	for _, res := range rs {
		if p, ok := heldPartition(r, res.Device); ok {
			parts = append(parts, fmt.Sprintf("partition %s at memory slice %d of gpu-%d", printable(p.Profile), p.PlacementStart, p.Parent))
			continue
		}
		i := slices.IndexFunc(r.MIG, func(m report.MIG) bool { return m.Device == res.Device })
		if i < 0 {
			parts = append(parts, "MIG device "+res.Device+" the node does not publish")
			continue
		}
		parts = append(parts, fmt.Sprintf("MIG device %s of gpu-%d", printable(r.MIG[i].Profile), r.MIG[i].Parent))
	}
	return strings.Join(parts, ", ")
}

// heldPartition finds a held partition of the node's GPUs partitioned on
// demand.
func heldPartition(r report.Node, device string) (report.MIG, bool) {
	for _, g := range r.OnDemand {
		for _, p := range g.Partitions {
			if p.Device == device {
				return p, true
			}
		}
	}
	return report.MIG{}, false
}

// linkVerdict says how the set's weakest link compares with the best the
// node offers for that many GPUs: the set the allocator picks on the idle
// node.
func linkVerdict(t *topology.Topology, rs []resourceapi.DeviceRequestAllocationResult) string {
	var pos []int
	for _, r := range rs {
		idx, err := driver.ParseDeviceName(r.Device)
		if err != nil {
			return "link class unknown: " + err.Error()
		}
		p, ok := t.Position(idx)
		if !ok {
			return fmt.Sprintf("link class unknown: the node does not publish %s", r.Device)
		}
		pos = append(pos, p)
	}
	weakest := topology.LinkNone
	for i := range pos {
		for j := i + 1; j < len(pos); j++ {
			if l := t.Link(pos[i], pos[j]); weakest == topology.LinkNone || l < weakest {
				weakest = l
			}
		}
	}
	s := "weakest link " + weakest.String()
	best, err := allocate.Allocate(&allocate.NodeState{Name: "idle", Topology: t}, allocate.Request{GPUs: len(pos)},
		allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack})
	switch {
	case err != nil:
	case weakest >= best.WeakestLink:
		s += fmt.Sprintf(", the best any %d GPUs of this node have", len(pos))
	default:
		s += fmt.Sprintf(", below the node's best for %d GPUs (%s): better sets were taken or did not match the request", len(pos), best.WeakestLink)
	}
	return s
}

// productsOf lists a node's GPU products with counts.
func productsOf(r report.Node) string {
	count := map[string]int{}
	var names []string
	for _, g := range r.GPUs {
		name := orDash(printable(g.Product))
		if count[name] == 0 {
			names = append(names, name)
		}
		count[name]++
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d x %s", count[n], n)
	}
	return strings.Join(parts, ", ")
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t))
}

// oneLine keeps a message on its table row.
func oneLine(s string) string {
	return strings.Join(strings.Fields(printable(s)), " ")
}
