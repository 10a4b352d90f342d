package gpucheck

import (
	"strings"
	"testing"
)

const probeOutput = `runc: warning: something
gpucheck: env.NVIDIA_VISIBLE_DEVICES=GPU-a
gpucheck: env.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M
gpucheck: devnode=/dev/nvidiactl
gpucheck: devnode=/dev/nvidia3
gpucheck: devnode=/dev/nvidia-uvm
gpucheck: devices=1
gpucheck: uuid.0=GPU-a
gpucheck: mem.0=42949672960
gpucheck: kernel=ok
gpucheck: alloc=fail:out of memory
`

func TestParseProbe(t *testing.T) {
	r, err := ParseProbe([]byte(probeOutput))
	if err != nil {
		t.Fatal(err)
	}
	if r.Env["NVIDIA_VISIBLE_DEVICES"] != "GPU-a" || r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" {
		t.Errorf("env %v", r.Env)
	}
	if strings.Join(r.DevNodes, " ") != "/dev/nvidia-uvm /dev/nvidia3 /dev/nvidiactl" {
		t.Errorf("device nodes %v", r.DevNodes)
	}
	if r.Devices != 1 || len(r.UUIDs) != 1 || r.UUIDs[0] != "GPU-a" || r.Kernel != "ok" || r.Alloc != "fail:out of memory" ||
		len(r.MemoryBytes) != 1 || r.MemoryBytes[0] != 42949672960 {
		t.Errorf("report %+v", r)
	}
	// A probe that stopped early reports no device count.
	r, err = ParseProbe([]byte("gpucheck: cuda=fail:no CUDA-capable device is detected\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Devices != -1 || r.CUDA != "fail:no CUDA-capable device is detected" {
		t.Errorf("early stop: %+v", r)
	}
}

func TestParseProbeErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"gpucheck: kernel\n", "want key=value"},
		{"gpucheck: devices=many\n", "devices: want a count"},
		{"gpucheck: uuid.x=GPU-a\n", "want uuid.<index>"},
		{"gpucheck: uuid.1=GPU-b\n", "none for device 0"},
		{"gpucheck: mem.0=lots\n", "want mem.<index>=<bytes>"},
		{"gpucheck: mem.1=1\n", "memory sizes but none for device 0"},
		{"gpucheck: colour=blue\n", `unknown key "colour"`},
	} {
		_, err := ParseProbe([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseProbe(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestCheckIsolation(t *testing.T) {
	gpu := ClaimedGPU{Index: 3, Minor: 3, UUID: "GPU-a"}
	ok := &ProbeReport{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a"}, DevNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidiactl"}}
	if errs := CheckIsolation(ok, gpu); len(errs) != 0 {
		t.Errorf("isolated container: %v", errs)
	}
	leaky := &ProbeReport{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, DevNodes: []string{"/dev/nvidia3", "/dev/nvidia4"}}
	got := strings.Join(CheckIsolation(leaky, gpu), "; ")
	for _, want := range []string{`NVIDIA_VISIBLE_DEVICES="GPU-a,GPU-b", want "GPU-a"`, "GPU device nodes [/dev/nvidia3 /dev/nvidia4], want exactly [/dev/nvidia3]", "no /dev/nvidiactl"} {
		if !strings.Contains(got, want) {
			t.Errorf("leaky container: %q does not mention %q", got, want)
		}
	}
}

func TestCheckCUDAAndAlloc(t *testing.T) {
	gpu := ClaimedGPU{UUID: "GPU-a"}
	for _, tc := range []struct {
		name string
		r    ProbeReport
		want string
	}{
		{"no driver", ProbeReport{Devices: -1, CUDA: "fail:CUDA driver version is insufficient"}, "CUDA: fail:CUDA driver version is insufficient"},
		{"no report", ProbeReport{Devices: -1}, "did not report CUDA devices"},
		{"two GPUs", ProbeReport{Devices: 2, UUIDs: []string{"GPU-a", "GPU-b"}}, "CUDA sees 2 devices [GPU-a GPU-b], want exactly GPU-a"},
		{"other GPU", ProbeReport{Devices: 1, UUIDs: []string{"GPU-b"}}, "CUDA device 0 is GPU-b, want GPU-a"},
		{"kernel", ProbeReport{Devices: 1, UUIDs: []string{"GPU-a"}, Kernel: "fail:wrong result at 7: 3.000000"}, `kernel: "fail:wrong result at 7`},
	} {
		if got := strings.Join(CheckCUDA(&tc.r, gpu), "; "); !strings.Contains(got, tc.want) || got == "" {
			t.Errorf("%s: CheckCUDA = %q, want %q", tc.name, got, tc.want)
		}
	}
	good := func(alloc string) *ProbeReport {
		return &ProbeReport{Devices: 1, UUIDs: []string{"GPU-a"}, Kernel: "ok", Alloc: alloc}
	}
	if errs := CheckCUDA(good(""), gpu); len(errs) != 0 {
		t.Errorf("working CUDA: %v", errs)
	}
	for _, tc := range []struct {
		r      *ProbeReport
		wantOK bool
		want   string
	}{
		{good("ok"), true, ""},
		{good("fail:out of memory"), false, ""},
		{good("fail:out of memory"), true, "allocating 10 MiB failed (fail:out of memory), want success"},
		{good("ok"), false, "allocating 10 MiB succeeded, want it refused"},
		{good(""), false, "did not report the allocation"},
		// No CUDA at all is no evidence that a limit holds.
		{&ProbeReport{Devices: -1, CUDA: "fail:MPS client failed to connect"}, false, "the allocation was not tried"},
	} {
		got := strings.Join(CheckAlloc(tc.r, gpu, 10, tc.wantOK), "; ")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("CheckAlloc(%+v, wantOK=%v) = %q, want %q", tc.r, tc.wantOK, got, tc.want)
		}
	}
}

// The probe prints every key ParseProbe reads, in the same spelling.
func TestProbeSourceSpeaksTheProtocol(t *testing.T) {
	src := string(ProbeSource)
	for _, key := range []string{`"gpucheck: env.%s=%s\n"`, `"gpucheck: devnode=/dev/%s\n"`, `"gpucheck: devices=%d\n"`, `"gpucheck: uuid.%d=GPU-`, `"gpucheck: kernel=ok\n"`, `"gpucheck: alloc=ok\n"`, `"gpucheck: %s=fail:%s\n"`, `"--set-env"`, `"--alloc-mib"`} {
		if !strings.Contains(src, key) {
			t.Errorf("gpucheck-probe.cu does not print %s", key)
		}
	}
}
