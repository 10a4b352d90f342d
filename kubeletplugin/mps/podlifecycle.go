package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// podOrigin is what start learned about the share's daemon pod, which
// decides what a failed Start may clean up.
type podOrigin int

const (
	// originUnknown: the API server gave no definite answer (the Node
	// read, a create error, a read of the existing pod failed), so a pod
	// may exist and serve running containers: nothing is deleted.
	originUnknown podOrigin = iota
	// originCreated: this call created the pod, or found none, so no
	// container uses it: a failure deletes it and the directories.
	originCreated
	// originAdopted: the pod existed (a plugin restart) and may serve
	// running containers: kept.
	originAdopted
	// originGone: the pod existed and is being deleted: nothing to keep.
	originGone
)

// Start creates the share's daemon pod (or adopts the one a previous
// plugin process created), waits until the daemon answers on its pipe and
// sets the share's limits as the daemon's defaults. On failure it deletes
// the pod and the directories and returns the daemon's log tail, but only
// where it knows no container can use them: a pod it created, or one
// already terminating. A pod that existed, or that the API server could
// not say anything definite about, is kept (ErrDaemonKept): a plugin that
// starts while etcd changes leaders must not kill running workloads' MPS
// servers.
func (d *PodDaemon) Start(ctx context.Context, share Share, dirs Dirs) error {
	if share.Concurrent() && (len(share.GPUs) != 1 || share.GPUs[0].UUID == "") {
		// The pod name must be unique among every node's daemon pods,
		// which only the GPU's UUID makes it.
		return fmt.Errorf("Concurrent MPS daemon of group %s on GPU %s: needs exactly one GPU with a known UUID", share.Group, share.gpuIDs())
	}
	// Directories that exist already may be a running daemon's.
	_, statErr := os.Lstat(dirs.Base)
	dirsExisted := statErr == nil
	if err := dirs.create(); err != nil {
		if dirsExisted {
			return err
		}
		return errors.Join(err, dirs.remove())
	}
	origin, err := d.start(ctx, share, dirs)
	if err == nil {
		return nil
	}
	tail := logTail(filepath.Join(dirs.Log, "control.log"))
	switch origin {
	case originCreated, originGone:
		return errors.Join(fmt.Errorf("%w%s", err, tail), d.Stop(ctx, share, dirs))
	case originAdopted:
		// The pod predates this call and may serve running containers
		// (a plugin restart while the API or the daemon hiccups): keep it.
		return fmt.Errorf("%w%s (%w)", err, tail, ErrDaemonKept)
	default:
		return fmt.Errorf("%w: whether a daemon pod runs is unknown, so it is left alone (%w)", err, ErrDaemonKept)
	}
}

// start creates or adopts the pod and waits for the daemon; it reports
// what it learned about the pod (podOrigin).
func (d *PodDaemon) start(ctx context.Context, share Share, dirs Dirs) (podOrigin, error) {
	logger := klog.FromContext(ctx)
	pods := d.cfg.Pods.Pods(d.cfg.Namespace)
	name := mpsPodName(share)
	owner, err := d.nodeOwner(ctx)
	if err != nil {
		return originUnknown, err
	}
	origin := originCreated
	_, err = pods.Create(ctx, d.pod(share, dirs, owner), metav1.CreateOptions{})
	if err != nil {
		// AlreadyExists is the usual answer at a restart, but an error
		// that comes first (a 5xx, a timeout whose write was applied,
		// an admission refusal) says nothing about the pod: read it.
		createErr := err
		old, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(createErr):
			// Definitely no pod: nothing runs that could be harmed.
			return originCreated, fmt.Errorf("creating MPS daemon pod %s/%s: %w", d.cfg.Namespace, name, createErr)
		case err != nil:
			return originUnknown, fmt.Errorf("creating MPS daemon pod %s/%s: %w; reading the existing one: %w", d.cfg.Namespace, name, createErr, err)
		case old.DeletionTimestamp != nil:
			// Already going away: nothing to keep.
			return originGone, fmt.Errorf("MPS daemon pod %s/%s of an earlier prepare is still terminating; retry later", d.cfg.Namespace, name)
		case old.Spec.NodeName != d.cfg.NodeName:
			return originAdopted, fmt.Errorf("MPS daemon pod %s/%s exists for node %q, not %q", d.cfg.Namespace, name, old.Spec.NodeName, d.cfg.NodeName)
		}
		origin = originAdopted
		logger.Info("Adopting running MPS control daemon pod", "pod", klog.KObj(old))
	}

	// The daemon is up when it answers on its pipe. A pod that ends first
	// (bad image, missing device) fails right away with its state.
	var lastOut string
	err = wait.PollUntilContextTimeout(ctx, d.cfg.PollInterval, d.cfg.StartTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return false, fmt.Errorf("MPS daemon pod %s/%s was deleted while starting", d.cfg.Namespace, name)
		case err != nil:
			// Transient (an API hiccup, the client's rate limit at the
			// end of the wait): keep waiting until the start timeout.
			lastOut = fmt.Sprintf("getting the pod: %v", err)
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("MPS daemon pod %s/%s ended (%s)%s", d.cfg.Namespace, name, p.Status.Phase, podState(p))
		}
		if p.Status.Phase != corev1.PodRunning {
			lastOut = "pod " + string(p.Status.Phase) + podState(p)
			return false, nil
		}
		if _, err := d.control(ctx, share, dirs, "get_server_list"); err != nil {
			lastOut = err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if wait.Interrupted(err) {
			return origin, fmt.Errorf("MPS daemon pod %s/%s did not answer on %s within %s (last: %s)", d.cfg.Namespace, name, dirs.Pipe, d.cfg.StartTimeout, lastOut)
		}
		return origin, err
	}
	return origin, d.setLimits(ctx, share, dirs)
}

// Stop deletes the daemon pod (killing the daemon and its server) and the
// share's directories. A pod that is already gone is fine.
func (d *PodDaemon) Stop(ctx context.Context, share Share, dirs Dirs) error {
	name := mpsPodName(share)
	err := d.cfg.Pods.Pods(d.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting MPS daemon pod %s/%s: %w", d.cfg.Namespace, name, err)
	}
	return dirs.remove()
}

// podState describes why a daemon pod is not running, for error messages.
func podState(p *corev1.Pod) string {
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("waiting: %s %s", cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			t := cs.State.Terminated
			parts = append(parts, fmt.Sprintf("exit code %d: %s %s", t.ExitCode, t.Reason, t.Message))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.TrimSpace(strings.Join(parts, "; "))
}

// logTailBytes is how much of the daemon's log an error carries.
const logTailBytes = 2048

// logTail returns the end of the daemon's log for an error message, or
// nothing when there is none.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return fmt.Sprintf("; daemon log %s ends with: %q", path, strings.TrimSpace(string(b)))
}
