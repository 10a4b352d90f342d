// Command workload is the container the e2e tests run to observe what a pod
// got from gpulink. It prints, to stdout (the container log):
//
//	ENV <name>=<value>      one line per environment variable, sorted
//	DEV /dev/<entry>        one line per /dev entry whose name starts with "nvidia"
//	FILE <path>             for each path in $GPULINK_WORKLOAD_FILES (comma-
//	                        separated) that exists in the container
//	NOFILE <path>: <error>  for each one that does not
//	READY                   after the lists
//
// and then sleeps until SIGTERM or SIGINT, when it exits 0; with
// GPULINK_WORKLOAD_EXIT set it exits 0 right away (init containers).
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	w := bufio.NewWriter(os.Stdout)
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Fprintf(w, "ENV %s\n", kv)
	}
	devs, err := filepath.Glob("/dev/nvidia*")
	if err != nil {
		fmt.Fprintf(w, "ERROR listing /dev: %v\n", err)
	}
	sort.Strings(devs)
	for _, d := range devs {
		fmt.Fprintf(w, "DEV %s\n", d)
	}
	// Also list nested device directories such as /dev/nvidia-caps.
	for _, d := range devs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			entries, err := os.ReadDir(d)
			if err != nil {
				fmt.Fprintf(w, "ERROR listing %s: %v\n", d, err)
				continue
			}
			for _, e := range entries {
				fmt.Fprintf(w, "DEV %s\n", strings.TrimSuffix(d, "/")+"/"+e.Name())
			}
		}
	}
	// Files the driver's CDI edits should have put into the container.
	if files := os.Getenv("GPULINK_WORKLOAD_FILES"); files != "" {
		for _, f := range strings.Split(files, ",") {
			if _, err := os.Lstat(f); err != nil {
				fmt.Fprintf(w, "NOFILE %s: %v\n", f, err)
				continue
			}
			fmt.Fprintf(w, "FILE %s\n", f)
		}
	}
	fmt.Fprintln(w, "READY")
	if err := w.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "writing stdout: %v\n", err)
		os.Exit(1)
	}
	if os.Getenv("GPULINK_WORKLOAD_EXIT") != "" {
		return
	}
	<-sigs
}
