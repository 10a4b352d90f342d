package gpucheck

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ProbeSource is the CUDA program the suite builds with nvcc on the GPU
// host and runs in its containers.
//
//go:embed probe/gpucheck-probe.cu
var ProbeSource []byte

// ProbeSourceName is the file name the bundle ships the source under.
const ProbeSourceName = "gpucheck-probe.cu"

// ShellProbeScript reports what gpucheck-probe reports about the
// environment and device nodes, without CUDA: the dry run's container
// program (run with /bin/sh -c).
const ShellProbeScript = `for v in NVIDIA_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_PINNED_DEVICE_MEM_LIMIT CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_CLIENT_PRIORITY; do
  eval "set=\${$v+x} val=\${$v-}"
  [ -n "$set" ] && echo "gpucheck: env.$v=$val"
done
for f in /dev/nvidia*; do [ -e "$f" ] && echo "gpucheck: devnode=$f"; done
for f in /dev/nvidia-caps/nvidia-cap*; do [ -e "$f" ] && echo "gpucheck: devnode=$f"; done
exit 0`

// ProbeReport is what a probe printed.
type ProbeReport struct {
	Env      map[string]string
	DevNodes []string
	// CUDA is empty, or "fail:<error>" when CUDA could not enumerate.
	CUDA string
	// Devices is -1 when the probe did not get as far (or has no CUDA).
	Devices int
	UUIDs   []string
	// MemoryBytes is each device's memory (MIG: its instance's).
	MemoryBytes []int64
	Kernel      string
	Alloc       string
	// SMs is device 0's multiprocessor count as CUDA reports it, 0 when
	// not reported.
	SMs int
	// Spin is the outcome of the timed kernel (--spin-reps): "ok" or
	// "fail:<error>"; empty when it did not run.
	Spin string
	// SpinMS are the repetitions' times (CUDA events), SpinStart and
	// SpinEnd the wall clock (ms since the epoch) around them, SpinLate
	// how late they started after --start-at (NaN when not reported).
	SpinMS             []float64
	SpinStart, SpinEnd float64
	SpinLate           float64
}

// ParseProbe reads the "gpucheck: key=value" lines among a container's
// output; other lines (runc, CUDA warnings) are ignored.
func ParseProbe(out []byte) (*ProbeReport, error) {
	r := &ProbeReport{Env: map[string]string{}, Devices: -1, SpinLate: math.NaN()}
	uuids := map[int]string{}
	mems := map[int]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "gpucheck: ")
		if !ok {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("probe line %q: want key=value", line)
		}
		switch {
		case strings.HasPrefix(key, "env."):
			r.Env[strings.TrimPrefix(key, "env.")] = val
		case key == "devnode":
			r.DevNodes = append(r.DevNodes, val)
		case key == "cuda":
			r.CUDA = val
		case key == "devices":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("probe line %q: devices: want a count", line)
			}
			r.Devices = n
		case strings.HasPrefix(key, "uuid."):
			i, err := strconv.Atoi(strings.TrimPrefix(key, "uuid."))
			if err != nil || i < 0 {
				return nil, fmt.Errorf("probe line %q: want uuid.<index>", line)
			}
			uuids[i] = val
		case strings.HasPrefix(key, "mem."):
			i, err := strconv.Atoi(strings.TrimPrefix(key, "mem."))
			n, nerr := strconv.ParseInt(val, 10, 64)
			if err != nil || i < 0 || nerr != nil || n < 0 {
				return nil, fmt.Errorf("probe line %q: want mem.<index>=<bytes>", line)
			}
			mems[i] = n
		case key == "kernel":
			r.Kernel = val
		case key == "alloc":
			r.Alloc = val
		case key == "sms":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("probe line %q: sms: want a count", line)
			}
			r.SMs = n
		case key == "spin":
			r.Spin = val
		case key == "spin.ms":
			for _, f := range strings.Split(val, ",") {
				ms, err := strconv.ParseFloat(f, 64)
				if err != nil || !(ms > 0) {
					return nil, fmt.Errorf("probe line %q: spin.ms: want positive times in ms", line)
				}
				r.SpinMS = append(r.SpinMS, ms)
			}
		case key == "spin.start", key == "spin.end", key == "spin.late":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("probe line %q: want a time in ms", line)
			}
			switch key {
			case "spin.start":
				r.SpinStart = v
			case "spin.end":
				r.SpinEnd = v
			default:
				r.SpinLate = v
			}
		default:
			return nil, fmt.Errorf("probe line %q: unknown key %q", line, key)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading probe output: %w", err)
	}
	for i := range len(uuids) {
		u, ok := uuids[i]
		if !ok {
			return nil, fmt.Errorf("probe output has %d UUIDs but none for device %d", len(uuids), i)
		}
		r.UUIDs = append(r.UUIDs, u)
	}
	for i := range len(mems) {
		n, ok := mems[i]
		if !ok {
			return nil, fmt.Errorf("probe output has %d memory sizes but none for device %d", len(mems), i)
		}
		r.MemoryBytes = append(r.MemoryBytes, n)
	}
	sort.Strings(r.DevNodes)
	return r, nil
}

// ClaimedGPU is the GPU a claim was prepared for.
type ClaimedGPU struct {
	Index, Minor int
	UUID         string
}

var gpuNode = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

// CheckIsolation checks what a container of a claim sees without CUDA:
// NVIDIA_VISIBLE_DEVICES names exactly the claimed GPU, the only per-GPU
// device node is the claimed one's, and /dev/nvidiactl is there.
func CheckIsolation(r *ProbeReport, gpu ClaimedGPU) []string {
	var errs []string
	if got, ok := r.Env["NVIDIA_VISIBLE_DEVICES"]; !ok || got != gpu.UUID {
		errs = append(errs, fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, gpu.UUID))
	}
	var perGPU []string
	for _, n := range r.DevNodes {
		if gpuNode.MatchString(n) {
			perGPU = append(perGPU, n)
		}
	}
	if want := fmt.Sprintf("/dev/nvidia%d", gpu.Minor); len(perGPU) != 1 || perGPU[0] != want {
		errs = append(errs, fmt.Sprintf("GPU device nodes %v, want exactly [%s]", perGPU, want))
	}
	if !slices.Contains(r.DevNodes, "/dev/nvidiactl") {
		errs = append(errs, "no /dev/nvidiactl")
	}
	return errs
}

// CheckIsolationOf is CheckIsolation for a claim of several GPUs: the
// container names exactly these GPUs (in any order: the plugin orders
// them by bus ID) and has exactly their device nodes.
func CheckIsolationOf(r *ProbeReport, gpus []ClaimedGPU) []string {
	var errs []string
	var wantUUIDs, wantNodes []string
	for _, g := range gpus {
		wantUUIDs = append(wantUUIDs, g.UUID)
		wantNodes = append(wantNodes, fmt.Sprintf("/dev/nvidia%d", g.Minor))
	}
	slices.Sort(wantUUIDs)
	slices.Sort(wantNodes)
	got := strings.Split(r.Env["NVIDIA_VISIBLE_DEVICES"], ",")
	slices.Sort(got)
	if !slices.Equal(got, wantUUIDs) {
		errs = append(errs, fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%q, want %v", r.Env["NVIDIA_VISIBLE_DEVICES"], wantUUIDs))
	}
	var perGPU []string
	for _, n := range r.DevNodes {
		if gpuNode.MatchString(n) {
			perGPU = append(perGPU, n)
		}
	}
	slices.Sort(perGPU)
	if !slices.Equal(perGPU, wantNodes) {
		errs = append(errs, fmt.Sprintf("GPU device nodes %v, want exactly %v", perGPU, wantNodes))
	}
	if !slices.Contains(r.DevNodes, "/dev/nvidiactl") {
		errs = append(errs, "no /dev/nvidiactl")
	}
	return errs
}

// CheckCUDAOf is CheckCUDA for a claim of several GPUs: CUDA sees exactly
// these GPUs (through the MPS daemon of the claim, when it has one).
func CheckCUDAOf(r *ProbeReport, gpus []ClaimedGPU) []string {
	var want []string
	for _, g := range gpus {
		want = append(want, g.UUID)
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(r.UUIDs))
	switch {
	case r.CUDA != "":
		return []string{"CUDA: " + r.CUDA}
	case r.Devices < 0:
		return []string{"the probe did not report CUDA devices (did it start? is libcuda in the container?)"}
	case r.Devices != len(gpus) || !slices.Equal(got, want):
		return []string{fmt.Sprintf("CUDA sees %d devices %v, want exactly %v", r.Devices, r.UUIDs, want)}
	case r.Kernel != "ok":
		return []string{fmt.Sprintf("kernel: %q", r.Kernel)}
	}
	return nil
}

// CheckCUDA checks what CUDA sees in the container: exactly one device,
// the claimed one by UUID, and a kernel that ran and computed right.
func CheckCUDA(r *ProbeReport, gpu ClaimedGPU) []string {
	switch {
	case r.CUDA != "":
		return []string{"CUDA: " + r.CUDA}
	case r.Devices < 0:
		return []string{"the probe did not report CUDA devices (did it start? is libcuda in the container?)"}
	case r.Devices != 1 || len(r.UUIDs) != 1:
		return []string{fmt.Sprintf("CUDA sees %d devices %v, want exactly %s", r.Devices, r.UUIDs, gpu.UUID)}
	case r.UUIDs[0] != gpu.UUID:
		return []string{fmt.Sprintf("CUDA device 0 is %s, want %s", r.UUIDs[0], gpu.UUID)}
	case r.Kernel != "ok":
		return []string{fmt.Sprintf("kernel: %q", r.Kernel)}
	}
	return nil
}

// CheckAlloc checks the outcome of the probe's --alloc-mib against what
// the limit demands. A probe that failed before allocating is a failure
// either way: a limit is only shown to hold by an allocation it refused.
func CheckAlloc(r *ProbeReport, gpu ClaimedGPU, mib int64, wantOK bool) []string {
	if errs := CheckCUDA(r, gpu); len(errs) > 0 {
		return append([]string{"CUDA did not work, so the allocation was not tried"}, errs...)
	}
	switch {
	case r.Alloc == "":
		return []string{"the probe did not report the allocation"}
	case wantOK && r.Alloc != "ok":
		return []string{fmt.Sprintf("allocating %d MiB failed (%s), want success", mib, r.Alloc)}
	case !wantOK && r.Alloc == "ok":
		return []string{fmt.Sprintf("allocating %d MiB succeeded, want it refused", mib)}
	case !wantOK && !strings.HasPrefix(r.Alloc, "fail:"):
		return []string{fmt.Sprintf("allocation result %q", r.Alloc)}
	}
	return nil
}
