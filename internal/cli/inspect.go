package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// inspectOptions are the flags of `inspect`.
type inspectOptions struct {
	kubeconfig string
	context    string
	timeout    time.Duration
	node       string
	output     outputFormat
	// watch re-renders on every change of the slices and claims, at most
	// once per watchInterval.
	watch         bool
	watchInterval time.Duration
	// onRender, if set, is called after each render in watch mode (tests).
	onRender func(renders int)
	// gangHierarchy are the node label keys gangs' levels are named by.
	gangHierarchy []string
}

// clientFactory connects to the cluster the options name and returns the
// client and the API server's address, for error messages. It is a
// parameter so tests can inject a fake clientset.
type clientFactory func(o *inspectOptions) (client kubernetes.Interface, server string, err error)

// listPageSize bounds each list call: a cluster with many claims is read
// in pages rather than in one response the API server must build at once.
const listPageSize = 500

func newInspectCommand(prog string) *cobra.Command {
	return newInspectCommandWith(prog, kubeconfigClient)
}

func newInspectCommandWith(prog string, newClient clientFactory) *cobra.Command {
	return newInspectCommandOpts(prog, newClient, &inspectOptions{output: outputTable})
}

// newInspectCommandOpts builds the command around o, which tests prepare
// with what no flag sets (onRender).
func newInspectCommandOpts(prog string, newClient clientFactory, o *inspectOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show each node's GPUs, who holds them and what is free, from a live cluster",
		Long: `Read gpulink's ResourceSlices (driver ` + driver.Name + `) and all ResourceClaims
from the cluster and show, per node: each GPU with its product and memory, the
claims holding it (whole, or each share's memory and cores) and the pods they
are reserved for, what is still free, and the node's link matrix as decoded
from the devices' links attributes. The accounting is the controller's own.
Then each gang (pods of a PodGroup or with the gpu.gpulink.dev/gang label):
its pods, where they are placed and the level of --gang-hierarchy they span.

Needs permission to list resourceslices and resourceclaims (all namespaces)
in the resource.k8s.io/v1 API.`,
		Example: "  " + prog + " inspect\n" +
			"  " + prog + " inspect --node gpu-node-1\n" +
			"  " + prog + " inspect --kubeconfig ~/.kube/lab --context lab -o json | jq '.nodes[].gpus[] | select(.free)'\n" +
			"  " + prog + " inspect --watch --node gpu-node-1",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runInspect(cmd, o, newClient)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	f.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	f.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "time limit for each API request (0: none)")
	f.StringVar(&o.node, "node", "", "show only this node")
	f.VarP(&o.output, "output", "o", "output format: table or json")
	f.BoolVarP(&o.watch, "watch", "w", false, "after the first view, watch slices and claims and show the view again on every change (table: redrawn in a terminal; json: one line per view) until interrupted")
	f.DurationVar(&o.watchInterval, "watch-interval", time.Second, "with --watch, the least time between two views; changes in between are shown together")
	f.StringSliceVar(&o.gangHierarchy, "gang-hierarchy", gang.DefaultKeys, "node label keys of the cluster's hierarchy, tightest first (the controller's --gang-hierarchy): each gang's level is named by them")
	return cmd
}

func runInspect(cmd *cobra.Command, o *inspectOptions, newClient clientFactory) error {
	if o.watchInterval < 0 {
		return usageError{fmt.Errorf("--watch-interval must not be negative, got %s", o.watchInterval)}
	}
	client, server, err := newClient(o)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if o.watch {
		return watchInspect(ctx, cmd, o, client, server)
	}
	published, err := listResourceSlices(ctx, client)
	if err != nil {
		return apiError("list ResourceSlices of driver "+driver.Name, server, err)
	}
	claims, err := listResourceClaims(ctx, client)
	if err != nil {
		return apiError("list ResourceClaims in all namespaces", server, err)
	}
	gs, err := listGangs(ctx, client, published, claims, o.gangHierarchy)
	if err != nil {
		if !apierrors.IsForbidden(err) {
			return apiError("list pods and nodes for the gangs", server, err)
		}
		// The nodes' view does not need pods: say what is missing.
		fmt.Fprintf(cmd.ErrOrStderr(), "Gangs not shown: %v (listing pods and nodes needs list permission on both)\n", err)
	}
	return renderInspect(cmd, o, server, published, claims, gs)
}

// renderInspect shows the report of the slices and claims given.
// gs are the gangs (nil in watch mode, which watches slices and claims only).
func renderInspect(cmd *cobra.Command, o *inspectOptions, server string, published []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, gs []report.Gang) error {
	reports := report.Build(published, claims)
	if o.node != "" {
		var mine []report.Node
		for _, r := range reports {
			if r.Name == o.node {
				mine = append(mine, r)
			}
		}
		reports = mine
	}

	if len(reports) == 0 {
		// Like kubectl's "No resources found": not an error, and on stderr
		// so that stdout stays valid JSON for scripts.
		if o.node != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "Node %q publishes no gpulink ResourceSlices and no claim holds its GPUs (is the gpulink kubelet plugin running there?).\n", o.node)
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "No gpulink ResourceSlices found at %s: no node publishes %s devices (is the gpulink kubelet plugin deployed?).\n", server, driver.Name)
		}
	}
	views, err := newInspectViews(reports)
	if err != nil {
		return err
	}
	if o.output == outputJSON {
		if o.watch {
			return writeJSONLine(cmd.OutOrStdout(), inspectDocument{Nodes: views, Gangs: gs})
		}
		return writeJSONDocument(cmd.OutOrStdout(), inspectDocument{Nodes: views, Gangs: gs})
	}
	return writeInspectTable(cmd.OutOrStdout(), views, gs)
}

// listResourceSlices lists gpulink's slices; the field selector spares
// the transfer of other drivers' slices (BuildReport filters again).
func listResourceSlices(ctx context.Context, client kubernetes.Interface) ([]*resourceapi.ResourceSlice, error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver.Name).String()}
	var out []*resourceapi.ResourceSlice
	err := listAll(ctx, opts, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.ResourceV1().ResourceSlices().List(ctx, opts)
	}, func(obj runtime.Object) { out = append(out, obj.(*resourceapi.ResourceSlice)) })
	return out, err
}

// listResourceClaims lists the claims of all namespaces: allocations are
// only in their status, which no selector can filter on.
func listResourceClaims(ctx context.Context, client kubernetes.Interface) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	err := listAll(ctx, metav1.ListOptions{}, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, opts)
	}, func(obj runtime.Object) { out = append(out, obj.(*resourceapi.ResourceClaim)) })
	return out, err
}

// listAll reads a list page by page with client-go's pager. When the
// server's snapshot expires half way, the pager starts over with one full
// list rather than mixing pages of two snapshots, which could show a
// device held twice or not at all.
func listAll(ctx context.Context, opts metav1.ListOptions, list pager.ListPageFunc, each func(runtime.Object)) error {
	p := pager.New(list)
	p.PageSize = listPageSize
	return p.EachListItem(ctx, opts, func(obj runtime.Object) error {
		each(obj)
		return nil
	})
}

// apiError names the failed request and the server, and adds a hint for
// the failures a user can act on.
func apiError(what, server string, err error) error {
	hint := ""
	switch {
	case apierrors.IsNotFound(err):
		hint = " (the server does not serve resource.k8s.io/v1: gpulink needs Kubernetes 1.34 or newer with DRA enabled)"
	case apierrors.IsForbidden(err):
		hint = " (your credentials need list permission on resourceslices and resourceclaims cluster-wide)"
	case apierrors.IsResourceExpired(err):
		hint = " (the cluster changed while it was read page by page; run the command again)"
	case apierrors.IsUnauthorized(err):
		hint = " (the kubeconfig's credentials were rejected; are they expired?)"
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		hint = " (the server did not answer in time; see --request-timeout)"
	}
	return fmt.Errorf("%s from %s: %w%s", what, server, err, hint)
}
