// Command demoreport is the Go half of `make demo` (hack/demo.sh): it waits
// for what the demo deployed and explains the result.
//
//	demoreport wait-slices -node NAME -devices N      until the node's gpulink pool has N devices
//	demoreport wait -pods a,b [-real-node NAME]       until each pod's claims are allocated, its
//	                                                  scheduling gate is gone and it is bound (and
//	                                                  Running when bound to the real node)
//	demoreport report -pods a,b [-real-node NAME]     print a table: pod, node, GPUs, weakest link,
//	                                                  share limits, and what first fit would have given
//	demoreport wait-gate                              until the chart's policy gives a pod with a claim
//	                                                  gpulink's scheduling gate (a server-side dry run)
//	demoreport driver-root -dir DIR -gpus N           lay out the stand-in driver install of the real
//	                                                  node under DIR, as the e2e tests do
//	                                                  (localcluster.WriteFakeDriverFiles, MakeDeviceNodes)
//
// Common flags: -kubeconfig, -namespace, -run-dir (a directory of NAME.pid
// and NAME.log files of the gpulink processes; waiting fails with the log's
// tail as soon as one of them has exited), -timeout. driver-root takes
// only its own and needs no cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type options struct {
	kubeconfig, namespace, runDir, realNode, node, podLogDir string
	pods                                                     []string
	devices, gpus                                            int
	driverRoot                                               string
	timeout                                                  time.Duration
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demoreport wait-slices|wait|report|wait-gate|driver-root [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet("demoreport "+cmd, flag.ExitOnError)
	var o options
	var pods string
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	fs.StringVar(&o.namespace, "namespace", "gpulink-demo", "namespace of the demo pods")
	fs.StringVar(&o.runDir, "run-dir", "", "directory of the gpulink processes' NAME.pid and NAME.log files")
	fs.StringVar(&o.realNode, "real-node", "local-node", "the node with a kubelet; pods bound to it must run")
	fs.StringVar(&o.node, "node", "", "wait-slices: the node")
	fs.IntVar(&o.devices, "devices", 0, "wait-slices: number of devices to wait for")
	fs.StringVar(&pods, "pods", "", "comma-separated pod names, in the order they were created")
	fs.StringVar(&o.podLogDir, "pod-log-dir", "", "the kubelet's pod log directory, read when the API cannot fetch a log")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Minute, "how long to wait")
	fs.StringVar(&o.driverRoot, "dir", "", "driver-root: the directory to lay the driver install out in")
	fs.IntVar(&o.gpus, "gpus", 0, "driver-root: number of GPUs (/dev/nvidiaN stand-ins)")
	_ = fs.Parse(os.Args[2:])
	if pods != "" {
		o.pods = strings.Split(pods, ",")
	}
	if cmd == "driver-root" {
		if err := driverRoot(o); err != nil {
			fatal(err)
		}
		return
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		fatal(fmt.Errorf("kubeconfig %q: %w", o.kubeconfig, err))
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+30*time.Second)
	defer cancel()
	switch cmd {
	case "wait-slices":
		err = waitSlices(ctx, client, o)
	case "wait":
		err = waitPods(ctx, client, o)
	case "report":
		err = report(ctx, client, o)
	case "wait-gate":
		err = waitGate(ctx, client, o)
	default:
		err = fmt.Errorf("unknown command %q (want wait-slices, wait, report, wait-gate or driver-root)", cmd)
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "demoreport: error: %v\n", err)
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[demo %s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}
