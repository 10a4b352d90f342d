package gpucheck

import (
	"context"
	"errors"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// stuckLister lists the instances a real lister listed last time it
// listed any: an instance that unprepare did not destroy.
type stuckLister struct {
	MIGLister
	seen *[]discovery.GPUInstance
}

func (l stuckLister) GPUInstances(ctx context.Context, uuid string) ([]discovery.GPUInstance, error) {
	gis, err := l.MIGLister.GPUInstances(ctx, uuid)
	if err == nil && len(gis) == 0 {
		return *l.seen, nil
	}
	*l.seen = gis
	return gis, err
}

// errLister is NVML failing to list instances.
type errLister struct{}

func (errLister) GPUInstances(context.Context, string) ([]discovery.GPUInstance, error) {
	return nil, errors.New("NVML: unknown error")
}

// The MIG rows on the go-nvml mock of a DGX A100 (40GB): MIG mode is only
// read; a GPU in MIG mode without instances gets one 1g.5gb partition
// created through the plugin's prepare, probed and destroyed; anything
// else skips with the reason and leaves the GPUs as they were.
func TestMIGRows(t *testing.T) {
	const memory1g = 4864 << 20 // the mock's 1g.5gb
	for _, tc := range []struct {
		name   string
		layout map[int][]string
		dryRun bool
		// cudaMemory and smiList are the fake host's (fakeHost).
		cudaMemory int64
		smiList    string
		lister     func(MIGLister) MIGLister
		want       map[string]Status
		details    map[string][]string
		// left is how many GPU instances GPU 1 has after the rows.
		left int
	}{{
		name: "no GPU in MIG mode: skipped",
		want: map[string]Status{CheckMIGMode: Pass, CheckMIGCreate: Skip, CheckMIGProbe: Skip, CheckMIGDestroy: Skip},
		details: map[string][]string{
			CheckMIGMode:   {"GPU 0: off", "GPU 7: off", "never changes MIG mode"},
			CheckMIGCreate: {"no GPU is in MIG mode", "never enables it"},
		},
	}, {
		name:   "the only GPU in MIG mode has instances someone made: skipped, left alone",
		layout: map[int][]string{1: {"1g.5gb"}},
		want:   map[string]Status{CheckMIGMode: Pass, CheckMIGCreate: Skip, CheckMIGProbe: Skip, CheckMIGDestroy: Skip},
		details: map[string][]string{
			CheckMIGMode:   {"GPU 1: on, 1 instance(s)", "GPU 0: off"},
			CheckMIGCreate: {"GPU 1: 1", "leaves them and the GPU alone"},
		},
		left: 1,
	}, {
		name:   "dry run: created, probed without CUDA, destroyed",
		layout: map[int][]string{1: nil},
		dryRun: true,
		want:   map[string]Status{CheckMIGMode: Pass, CheckMIGCreate: Pass, CheckMIGProbe: Pass, CheckMIGDestroy: Pass},
		details: map[string][]string{
			CheckMIGCreate:  {"1g.5gb at memory slice 0 of GPU 1", "gpu-1-part-1g-5gb-at-0", "NVML lists its GPU instance", "not run (dry run)"},
			CheckMIGProbe:   {"NVIDIA_VISIBLE_DEVICES=MIG-", "/dev/nvidia1,", "/dev/nvidia-caps/nvidia-cap"},
			CheckMIGDestroy: {"NVML lists no GPU instance there"},
		},
	}, {
		name:       "GPU: nvidia-smi -L and CUDA see the partition",
		layout:     map[int][]string{1: nil},
		cudaMemory: memory1g - 300<<20, smiList: "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-x)\n  MIG 1g.5gb      Device  0: (UUID: MIG-y)\n",
		want: map[string]Status{CheckMIGMode: Pass, CheckMIGCreate: Pass, CheckMIGProbe: Pass, CheckMIGDestroy: Pass},
		details: map[string][]string{
			CheckMIGCreate: {"nvidia-smi -L lists it"},
			CheckMIGProbe:  {"CUDA devices [GPU-", "kernel ok"},
		},
	}, {
		name:       "GPU: CUDA reports the whole GPU's memory",
		layout:     map[int][]string{1: nil},
		cudaMemory: 40 << 30, smiList: "  MIG 1g.5gb      Device  0: (UUID: MIG-y)\n",
		want: map[string]Status{CheckMIGCreate: Pass, CheckMIGProbe: Fail, CheckMIGDestroy: Pass},
		details: map[string][]string{
			CheckMIGProbe: {"CUDA device memory 40960 MiB, want the 1g.5gb partition's 4864 MiB"},
		},
	}, {
		name:       "GPU: nvidia-smi -L does not list the MIG device",
		layout:     map[int][]string{1: nil},
		cudaMemory: memory1g, smiList: "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-x)\n",
		want: map[string]Status{CheckMIGCreate: Fail, CheckMIGProbe: Pass, CheckMIGDestroy: Pass},
		details: map[string][]string{
			CheckMIGCreate: {"nvidia-smi -L lists no MIG 1g.5gb device"},
		},
	}, {
		name:   "NVML still lists the instance after unprepare",
		layout: map[int][]string{1: nil},
		dryRun: true,
		lister: func(l MIGLister) MIGLister { return stuckLister{l, new([]discovery.GPUInstance)} },
		want:   map[string]Status{CheckMIGCreate: Pass, CheckMIGDestroy: Fail},
		details: map[string][]string{
			CheckMIGDestroy: {"unprepared, but NVML still lists GPU instance"},
		},
	}, {
		name:   "NVML cannot list instances: create fails, the partition is still destroyed",
		layout: map[int][]string{1: nil},
		dryRun: true,
		lister: func(MIGLister) MIGLister { return errLister{} },
		want:   map[string]Status{CheckMIGCreate: Fail, CheckMIGProbe: Pass, CheckMIGDestroy: Fail},
		details: map[string][]string{
			CheckMIGCreate:  {"NVML: unknown error"},
			CheckMIGDestroy: {"NVML: unknown error"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d, err := discovery.NewMockWith("dgxa100", discovery.MockOptions{MIG: tc.layout})
			if err != nil {
				t.Fatal(err)
			}
			nvml, ok := discovery.MIGInstancesOf(d)
			if !ok {
				t.Fatal("the mock discoverer has no MIG instance manager")
			}
			topo, err := d.Discover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cfg := gpuConfig(t)
			cfg.DryRun = tc.dryRun
			host := &fakeHost{gpus: topo.GPUs, migMemoryBytes: tc.cudaMemory, smiList: tc.smiList}
			var lister MIGLister = nvml
			if tc.lister != nil {
				lister = tc.lister(nvml)
			}
			preparers := 0
			s := &suite{cfg: cfg, rep: &Report{}, deps: Deps{
				Run: host.run, Discoverer: d, MIG: lister,
				NewMIGPreparer: func(ctx context.Context, gpu int) (Preparer, error) {
					preparers++
					return NewPluginPreparer(ctx, PluginPreparerOptions{
						WorkDir: cfg.WorkDir, NodeName: cfg.NodeName, Discoverer: d,
						MPSDaemon: mps.DirOnlyDaemon{}, Stat: DryRunStat, MIGOnDemand: "1",
					})
				},
			}}
			if !s.prepareProgram(ctx) {
				t.Fatalf("probe: %+v", s.rep.Results)
			}
			s.migRows(ctx, topo)
			got := results(t, s.rep.Results)
			for name, st := range tc.want {
				wantResult(t, got, name, st, tc.details[name]...)
			}
			if created := tc.want[CheckMIGCreate] != Skip; (preparers > 0) != created {
				t.Errorf("MIG preparers built: %d, want some only when a partition is created", preparers)
			}
			// MIG mode is as it was on every GPU, and the partition is gone.
			after, err := d.Discover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range after.GPUs {
				_, inMIG := tc.layout[g.Index]
				if g.MIGEnabled() != inMIG || topo.GPUs[i].MIGEnabled() != inMIG {
					t.Errorf("GPU %d: MIG mode %t after the rows, want %t", g.Index, g.MIGEnabled(), inMIG)
				}
			}
			if _, inMIG := tc.layout[1]; inMIG {
				gis, err := nvml.GPUInstances(ctx, topo.GPUs[1].UUID)
				if err != nil || len(gis) != tc.left {
					t.Errorf("GPU 1 has GPU instances %+v (%v) after the rows, want %d", gis, err, tc.left)
				}
			}
		})
	}
}
