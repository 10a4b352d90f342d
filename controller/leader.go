package controller

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaderElection configures leader election with a Lease.
type LeaderElection struct {
	Namespace     string
	Name          string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Watchdog, if set, reports a leader that failed to renew on /healthz.
	Watchdog *leaderelection.HealthzAdaptor
}

// RunLeading runs lead while this process holds the Lease. It returns when
// ctx ends or leadership is lost; after a loss the process should exit so
// that no two instances ever decide at the same time (a new leader starts
// from a fresh cache).
func RunLeading(ctx context.Context, client kubernetes.Interface, le LeaderElection, lead func(context.Context)) error {
	logger := klog.FromContext(ctx)
	// The pod name tells replicas apart also when they share a host
	// network (and so a hostname); the UUID keeps a restarted process from
	// taking over its predecessor's lease record.
	host := os.Getenv("POD_NAME")
	if host == "" {
		var err error
		if host, err = os.Hostname(); err != nil {
			return fmt.Errorf("leader election identity: %w", err)
		}
	}
	id := host + "_" + uuid.NewString()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, le.Namespace, le.Name,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("creating lease lock %s/%s: %w", le.Namespace, le.Name, err)
	}
	lost := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		WatchDog:        le.Watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Became leader", "identity", id)
				lead(ctx)
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "identity", id)
				close(lost)
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another instance leads", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("creating leader elector: %w", err)
	}
	if le.Watchdog != nil {
		le.Watchdog.SetLeaderElection(elector)
	}
	elector.Run(ctx)
	select {
	case <-lost:
		if ctx.Err() == nil {
			return fmt.Errorf("lost leadership of lease %s/%s", le.Namespace, le.Name)
		}
	default:
	}
	return nil
}
