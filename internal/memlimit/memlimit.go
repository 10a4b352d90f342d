// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit, which the chart passes in through the
// downward API.
//
// Without a soft limit the runtime lets the heap grow to twice what is
// live before it collects (GOGC=100): a controller whose live heap is
// more than half its container's limit is killed for memory at the next
// burst of objects (a relist, a wave of pods) although a collection would
// have kept it under. With the limit the runtime collects harder as the
// heap nears it instead.
package memlimit

import (
	"fmt"
	"strconv"
)

const (
	// EnvContainerLimit names the variable that holds the container's
	// memory limit in bytes (the chart sets it from
	// resourceFieldRef limits.memory; a container without a limit gets
	// the node's allocatable memory there).
	EnvContainerLimit = "GPULINK_CONTAINER_MEMORY_LIMIT"
	// envGoMemLimit is the runtime's own variable: where it is set the
	// operator chose a limit, and it stands.
	envGoMemLimit = "GOMEMLIMIT"
	// Percent is the share of the container's limit the heap may take:
	// the rest is for what the runtime's limit does not cover (memory
	// not from the Go runtime) and for the collector to keep up.
	Percent = 90
)

// Result says what Apply did.
type Result struct {
	// ContainerBytes is the container's limit read (0: none given).
	ContainerBytes int64
	// LimitBytes is the soft limit set (0: none set).
	LimitBytes int64
	// Reason says why none was set.
	Reason string
}

// Apply sets the runtime's soft memory limit (through set, which is
// runtime/debug.SetMemoryLimit in the binaries) to Percent of the
// container's limit read from getenv, unless GOMEMLIMIT is set. A value
// that is not a positive number of bytes is an error naming the variable
// and the value, and nothing is set.
func Apply(getenv func(string) string, set func(int64) int64) (Result, error) {
	if v := getenv(envGoMemLimit); v != "" {
		return Result{Reason: envGoMemLimit + "=" + v + " stands"}, nil
	}
	raw := getenv(EnvContainerLimit)
	if raw == "" {
		return Result{Reason: EnvContainerLimit + " is not set (no soft limit unless GOMEMLIMIT sets one)"}, nil
	}
	bytes, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || bytes <= 0 {
		return Result{}, fmt.Errorf("%s=%q: want the container's memory limit as a positive number of bytes (resourceFieldRef limits.memory)", EnvContainerLimit, raw)
	}
	limit := bytes / 100 * Percent
	set(limit)
	return Result{ContainerBytes: bytes, LimitBytes: limit}, nil
}
