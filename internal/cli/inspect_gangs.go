package cli

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// listGangs reads the pods and nodes of the cluster and returns each
// gang's pods, placement and the level it spans in the hierarchy of keys
// (the controller's --gang-hierarchy); a node without the NVLink clique
// label is in the clique its published slices name, as for the controller.
func listGangs(ctx context.Context, client kubernetes.Interface, published []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, keys []string) ([]report.Gang, error) {
	h, err := gang.NewHierarchyFromKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("--gang-hierarchy: %w", err)
	}
	var pods []*corev1.Pod
	err = listAll(ctx, metav1.ListOptions{}, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	}, func(obj runtime.Object) { pods = append(pods, obj.(*corev1.Pod)) })
	if err != nil {
		return nil, err
	}
	labels := map[string]map[string]string{}
	err = listAll(ctx, metav1.ListOptions{}, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Nodes().List(ctx, opts)
	}, func(obj runtime.Object) {
		n := obj.(*corev1.Node)
		labels[n.Name] = n.Labels
	})
	if err != nil {
		return nil, err
	}
	lookup, err := listPodGroups(ctx, client)
	if err != nil {
		return nil, err
	}
	return report.Gangs(pods, claims, report.WithPublishedCliques(labels, published), h, lookup), nil
}

// listPodGroups reads the cluster's PodGroups, so that pods in a PodGroup
// of the basic policy (every Job's, where the Job controller runs with
// WorkloadWithJob) are not listed as a gang. Where the Workload API is not
// served or the user may not list PodGroups, it returns no lookup: every
// PodGroup a pod names is then shown as a gang.
func listPodGroups(ctx context.Context, client kubernetes.Interface) (gangs.PodGroupLookup, error) {
	byKey := map[string]*schedulingv1beta1.PodGroup{}
	err := listAll(ctx, metav1.ListOptions{}, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.SchedulingV1beta1().PodGroups(metav1.NamespaceAll).List(ctx, opts)
	}, func(obj runtime.Object) {
		pg := obj.(*schedulingv1beta1.PodGroup)
		byKey[pg.Namespace+"/"+pg.Name] = pg
	})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing PodGroups (%s): %w", schedulingv1beta1.SchemeGroupVersion, err)
	}
	return func(ns, name string) (*schedulingv1beta1.PodGroup, bool) {
		pg, ok := byKey[ns+"/"+name]
		return pg, ok
	}, nil
}

// writeGangRows renders the gangs after the nodes.
func writeGangRows(p *errWriter, gs []report.Gang) {
	if len(gs) == 0 {
		return
	}
	p.printf("\nGANGS\n")
	p.printf("  NAMESPACE\tGANG\tSOURCE\tPODS\tPLACED\tNODES\tLEVEL\tDOMAIN\n")
	for _, g := range gs {
		pods := fmt.Sprint(len(g.Pods))
		if g.MinCount > 0 {
			pods += fmt.Sprintf(" (min %d)", g.MinCount)
		}
		level, domain := g.Level, g.Domain
		if level == "" {
			level, domain = "-", "-"
		}
		if domain == "" {
			domain = "-"
		}
		p.printf("  %s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", g.Namespace, g.Name, g.Source, pods, g.Placed, g.Nodes, level, domain)
	}
}
