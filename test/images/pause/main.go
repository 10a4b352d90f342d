// Command pause is the sandbox ("pause") process of the local test cluster's
// pods: it does nothing until SIGTERM or SIGINT and then exits 0. It is built
// as a static binary and packed into an image by test/localcluster.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// Reap children that get reparented to us while we run as PID 1 of a pod.
	signal.Notify(sigs, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
