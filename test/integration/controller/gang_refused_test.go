//go:build integration

package controller_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/driver/gang"
)

// localVolume creates a local PersistentVolume on the nodes whose label
// key has value, pre-bound to a claim of the same name, and waits until
// the claim is bound. gpulink does not model volumes: kube-scheduler's
// VolumeBinding refuses a pod using it on any other node.
func (e *env) localVolume(name, key, value string) {
	e.t.Helper()
	pvName := e.ns + "-" + name
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/scratch"}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.ns, Name: name},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}}},
		}}
	if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.client.CoreV1().PersistentVolumes().Delete(e.ctx, pvName, metav1.DeleteOptions{})
	})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: new(string),
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}}
	if _, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.poll("volume claim "+name+" bound", time.Minute, func() bool {
		c, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound
	})
}

// TestGangRefusedPlacedAgainTogether: kube-scheduler refuses a gang
// gpulink placed (its pods' local volumes are in leaf l2, which gpulink
// does not see; the first placement goes to l1, the only leaf with two
// free nodes then). With the Workload API the whole PodGroup is refused;
// through the labels each pod is. No pod is bound and their claims are
// released: gpulink places the gang again as a whole, all or nothing,
// within one leaf and away from the nodes it was refused on, and both
// pods run in l2, freed meanwhile.
func TestGangRefusedPlacedAgainTogether(t *testing.T) {
	e := gangCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	for _, n := range []string{"b1", "b2", "b3"} {
		e.blocker("block-"+n, e.node(n))
	}
	for i := range 2 {
		e.localVolume(fmt.Sprintf("scratch-%d", i), gang.LabelLeaf, e.ns+"-l2")
	}
	pods := e.gangPodsOf(gangOf{Name: "vol", Size: 2, PodGroup: true, Level: gang.LabelLeaf, Required: true,
		Edit: func(i int, p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: fmt.Sprintf("scratch-%d", i)}}}}
		}})
	var first []string
	e.poll("gang allocated in leaf l1", time.Minute, func() bool {
		first = e.allocatedNodes(pods)
		return len(first) == 2 && e.leafOf(t, first[0]) == "l1" && e.leafOf(t, first[1]) == "l1"
	})
	// Room in l2 for the second placement; the first is refused meanwhile.
	e.deletePod("block-b3")
	nodes := e.boundNodes(pods, 2*time.Minute)
	for _, n := range nodes {
		if e.leafOf(t, n) != "l2" || slices.Contains(first, n) {
			t.Errorf("gang bound on %v (first placed on %v), want both in leaf l2", nodes, first)
		}
	}
	if nodes[0] == nodes[1] {
		t.Errorf("4-GPU pods bound on one 4-GPU node: %v", nodes)
	}
	// Events are recorded asynchronously, sometimes after the pods are bound.
	e.poll("an event saying the refused gang is placed again together", 30*time.Second, func() bool {
		for _, p := range pods {
			if hasEvent(e.events(p, ""), "placing its 2 pods again together") {
				return true
			}
		}
		return false
	})
}

// allocatedNodes returns the nodes the pods' claims are allocated on, one
// per pod whose claims are (none for the others).
func (e *env) allocatedNodes(pods []string) []string {
	var out []string
	for _, name := range pods {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		for _, c := range e.claimsOf(p) {
			if n := nodeOf(c); n != "" {
				out = append(out, n)
				break
			}
		}
	}
	return out
}
