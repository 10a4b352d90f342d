// Command localcluster runs a local Kubernetes cluster (package
// test/localcluster) in the foreground until SIGTERM or SIGINT, then stops
// it. hack/cluster.sh up starts it in the background and hack/cluster.sh
// down signals it.
//
//	localcluster -dir _output/cluster [-real-node] [-api-nodes N] [-node-name NAME] [-ready-file FILE]
//	localcluster -cleanup -dir _output/cluster
//
// Before starting it cleans up and removes whatever an earlier run left in
// -dir. Once the cluster is usable it writes -ready-file (default
// <dir>/ready) holding the kubeconfig path; it removes that file and the
// kubeconfig when it stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpulink/gpulink/test/localcluster"
)

func main() {
	var (
		dir       = flag.String("dir", "", "state directory (required); its previous content is removed")
		binDir    = flag.String("bin-dir", "", "directory of etcd, kube-* and containerd binaries (default $GPULINK_BIN_DIR or <repo>/_output/bin)")
		realNode  = flag.Bool("real-node", false, "run containerd and a kubelet as a real node (needs root)")
		nodeName  = flag.String("node-name", localcluster.DefaultNodeName, "name of the real node")
		apiNodes  = flag.Int("api-nodes", 0, "number of API-only nodes (api-node-1 ...) to create")
		readyFile = flag.String("ready-file", "", "file written once the cluster is usable (default <dir>/ready)")
		gates     = flag.String("feature-gates", "", "feature gates for all components, e.g. DRAListTypeAttributes=true,Foo=false")
		cleanup   = flag.Bool("cleanup", false, "only clean up what a crashed run left in -dir (processes, cgroups, mounts) and exit")
	)
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if *cleanup {
		if *dir == "" {
			log.Fatal("error: -dir is required")
		}
		if err := localcluster.Cleanup(*dir); err != nil {
			log.Fatalf("error: %v", err)
		}
		return
	}
	if err := run(*dir, *binDir, *realNode, *nodeName, *apiNodes, *readyFile, *gates); err != nil {
		log.Printf("error: %v", err)
		os.Exit(1)
	}
}

func run(dir, binDir string, realNode bool, nodeName string, apiNodes int, readyFile, gates string) error {
	if dir == "" {
		return errors.New("-dir is required")
	}
	if apiNodes < 0 {
		return fmt.Errorf("-api-nodes must not be negative, got %d", apiNodes)
	}
	featureGates, err := parseGates(gates)
	if err != nil {
		return err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	if readyFile == "" {
		readyFile = filepath.Join(dir, "ready")
	}
	if _, err := os.Stat(dir); err == nil {
		log.Printf("cleaning up previous state in %s", dir)
		if err := localcluster.Cleanup(dir); err != nil {
			return fmt.Errorf("cleaning up %s: %w", dir, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("removing %s: %w", dir, err)
		}
	}
	_ = os.Remove(readyFile)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c, err := localcluster.Start(ctx, localcluster.Options{
		Dir:          dir,
		BinDir:       binDir,
		RealNode:     realNode,
		NodeName:     nodeName,
		FeatureGates: featureGates,
		Logf:         log.Printf,
	})
	if err != nil {
		return err
	}
	runErr := func() error {
		for i := 1; i <= apiNodes; i++ {
			if err := c.AddAPINode(ctx, fmt.Sprintf("api-node-%d", i)); err != nil {
				return err
			}
		}
		if err := os.WriteFile(readyFile, []byte(c.Kubeconfig()+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing ready file: %w", err)
		}
		log.Printf("cluster ready; kubeconfig %s", c.Kubeconfig())
		<-ctx.Done()
		log.Printf("stopping")
		return nil
	}()
	_ = os.Remove(readyFile)
	start := time.Now()
	stopErr := c.Stop()
	_ = os.Remove(c.Kubeconfig())
	if stopErr == nil {
		log.Printf("stopped in %.1fs", time.Since(start).Seconds())
	}
	return errors.Join(runErr, stopErr)
}

func parseGates(s string) (map[string]bool, error) {
	if s == "" {
		return nil, nil
	}
	gates := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || (v != "true" && v != "false") {
			return nil, fmt.Errorf("-feature-gates: want Name=true|false, got %q", kv)
		}
		gates[k] = v == "true"
	}
	return gates, nil
}
