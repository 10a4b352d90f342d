package discovery

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gpulink/gpulink/driver/topology"
)

func fileOptions(path string) TopologyFileOptions {
	return TopologyFileOptions{
		Path:        path,
		NodeName:    "gpu-node-1.example.com",
		ProductName: "Tesla V100-SXM2-32GB",
		MemoryBytes: 32 << 30,
	}
}

func TestNewTopologyFileValidation(t *testing.T) {
	good := filepath.Join("testdata", "v100-sxm2-8-aliyun-sccgn6.txt")
	tests := []struct {
		name    string
		mutate  func(o *TopologyFileOptions)
		wantErr string
		wantIs  error
	}{
		{name: "empty path", mutate: func(o *TopologyFileOptions) { o.Path = "" }, wantErr: "option Path is empty"},
		{name: "missing file", mutate: func(o *TopologyFileOptions) { o.Path = "testdata/nope.txt" }, wantErr: `option Path "testdata/nope.txt"`, wantIs: fs.ErrNotExist},
		{name: "directory", mutate: func(o *TopologyFileOptions) { o.Path = "testdata" }, wantErr: `option Path "testdata": is a d`},
		{name: "empty node name", mutate: func(o *TopologyFileOptions) { o.NodeName = "" }, wantErr: `option NodeName ""`},
		{name: "upper-case node name", mutate: func(o *TopologyFileOptions) { o.NodeName = "Node1" }, wantErr: `option NodeName "Node1"`},
		{name: "node name with slash", mutate: func(o *TopologyFileOptions) { o.NodeName = "a/b" }, wantErr: `option NodeName "a/b"`},
		{name: "node name too long", mutate: func(o *TopologyFileOptions) { o.NodeName = strings.Repeat("a", 254) }, wantErr: "option NodeName"},
		{name: "empty product", mutate: func(o *TopologyFileOptions) { o.ProductName = " " }, wantErr: `option ProductName " "`},
		{name: "long product", mutate: func(o *TopologyFileOptions) { o.ProductName = strings.Repeat("x", 65) }, wantErr: "65 bytes, at most 64"},
		{name: "product with newline", mutate: func(o *TopologyFileOptions) { o.ProductName = "A100\n" }, wantErr: "non-printable"},
		{name: "zero memory", mutate: func(o *TopologyFileOptions) { o.MemoryBytes = 0 }, wantErr: "option MemoryBytes 0"},
		{name: "negative memory", mutate: func(o *TopologyFileOptions) { o.MemoryBytes = -1 }, wantErr: "option MemoryBytes -1"},
		{name: "bad compute capability", mutate: func(o *TopologyFileOptions) { o.CUDAComputeCapability = "sm_70" }, wantErr: `option CUDAComputeCapability "sm_70"`},
		{name: "unknown architecture", mutate: func(o *TopologyFileOptions) { o.Architecture = "Volta" }, wantErr: `option Architecture "Volta": want one of ada, ampere,`},
		{name: "contradicting architecture", mutate: func(o *TopologyFileOptions) {
			o.Architecture, o.CUDAComputeCapability = "ampere", "7.0"
		}, wantErr: `Architecture "ampere" contradicts CUDAComputeCapability "7.0", which is volta`},
		{name: "bad driver version", mutate: func(o *TopologyFileOptions) { o.DriverVersion = "v550" }, wantErr: `option DriverVersion "v550"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := fileOptions(good)
			tc.mutate(&o)
			d, err := NewTopologyFile(o)
			if err == nil {
				t.Fatalf("NewTopologyFile(%+v) = %v, want an error", o, d)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %q does not wrap %v", err, tc.wantIs)
			}
		})
	}
}

func TestTopologyFileDiscover(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		mutate func(o *TopologyFileOptions)
		arch   string
		numa   int
		cpus   string
		want   []string
	}{{
		name: "V100 hybrid cube mesh",
		file: "v100-sxm2-8-aliyun-sccgn6.txt",
		mutate: func(o *TopologyFileOptions) {
			o.CUDAComputeCapability, o.DriverVersion = "7.0", "535.104.05"
		},
		arch: "volta", numa: -1, cpus: "0-95",
		want: []string{
			"X NV1 NV1 NV2 SYS SYS NV2 SYS",
			"NV1 X NV2 NV1 SYS SYS SYS NV2",
			"NV1 NV2 X NV2 NV1 SYS SYS SYS",
			"NV2 NV1 NV2 X SYS NV1 SYS SYS",
			"SYS SYS NV1 SYS X NV2 NV1 NV2",
			"SYS SYS SYS NV1 NV2 X NV2 NV1",
			"NV2 SYS SYS SYS NV1 NV2 X NV1",
			"SYS NV2 SYS SYS NV2 NV1 NV1 X",
		},
	}, {
		name: "P40 on PCIe switches",
		file: "p40-pcie-7.txt",
		mutate: func(o *TopologyFileOptions) {
			o.ProductName, o.MemoryBytes, o.Architecture = "Tesla P40", 24<<30, "pascal"
		},
		arch: "pascal", numa: 0, cpus: "0-13,28-41",
		want: []string{
			"X PIX PIX PHB PHB PHB PHB",
			"PIX X PIX PHB PHB PHB PHB",
			"PIX PIX X PHB PHB PHB PHB",
			"PHB PHB PHB X PIX PIX PIX",
			"PHB PHB PHB PIX X PIX PIX",
			"PHB PHB PHB PIX PIX X PIX",
			"PHB PHB PHB PIX PIX PIX X",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := fileOptions(filepath.Join("testdata", tc.file))
			tc.mutate(&o)
			d, err := NewTopologyFile(o)
			if err != nil {
				t.Fatalf("NewTopologyFile: %v", err)
			}
			topo, err := d.Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			sameRows(t, matrix(topo), tc.want)
			busIDs := map[string]bool{}
			for p, g := range topo.GPUs {
				want := topology.GPU{
					Index: p, Minor: p, UUID: syntheticUUID(o.NodeName, p),
					ProductName: o.ProductName, Architecture: tc.arch,
					CUDAComputeCapability: o.CUDAComputeCapability, DriverVersion: o.DriverVersion,
					MemoryBytes: o.MemoryBytes, PCIBusID: g.PCIBusID, NUMANode: tc.numa, CPUAffinity: tc.cpus,
				}
				if g != want {
					t.Errorf("position %d:\n got %+v\nwant %+v", p, g, want)
				}
				if canon, err := canonicalBusID(g.PCIBusID); err != nil || canon != g.PCIBusID || busIDs[g.PCIBusID] {
					t.Errorf("GPU %d: bus ID %q is not a unique canonical bus ID (%v)", p, g.PCIBusID, err)
				}
				busIDs[g.PCIBusID] = true
			}
		})
	}
}

func TestSyntheticUUID(t *testing.T) {
	a := syntheticUUID("node-a", 0)
	if !strings.HasPrefix(a, "GPU-") {
		t.Fatalf("UUID %q lacks the GPU- prefix", a)
	}
	u, err := uuid.Parse(strings.TrimPrefix(a, "GPU-"))
	if err != nil || u.Version() != 5 {
		t.Fatalf("UUID %q: want a version 5 UUID, got version %v, %v", a, u.Version(), err)
	}
	tests := []struct {
		name       string
		node       string
		index      int
		wantSameAs bool
	}{
		{name: "same node and index", node: "node-a", index: 0, wantSameAs: true},
		{name: "other index", node: "node-a", index: 1},
		{name: "other node", node: "node-b", index: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := syntheticUUID(tc.node, tc.index); (got == a) != tc.wantSameAs {
				t.Errorf("syntheticUUID(%q, %d) = %q vs %q for node-a/0; want equal: %v", tc.node, tc.index, got, a, tc.wantSameAs)
			}
		})
	}
}

// TestTopologyFileRereads checks that edits to the file show up on the
// next Discover and that a broken file fails it.
func TestTopologyFileRereads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topo.txt")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\t X \n")
	d, err := NewTopologyFile(fileOptions(path))
	if err != nil {
		t.Fatalf("NewTopologyFile: %v", err)
	}
	steps := []struct {
		text    string
		want    []string
		wantErr string
	}{
		{want: []string{"X PIX", "PIX X"}},
		{text: "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV2\tSYS\nGPU1\tNV2\t X \tSYS\nGPU2\tSYS\tSYS\t X \n",
			want: []string{"X NV2 SYS", "NV2 X SYS", "SYS SYS X"}},
		{text: "\tGPU0\tGPU1\nGPU0\t X \tBOGUS\nGPU1\tBOGUS\t X \n", wantErr: path},
	}
	for i, s := range steps {
		if s.text != "" {
			write(s.text)
		}
		topo, err := d.Discover(context.Background())
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Errorf("step %d: got %v, want an error naming %q", i, err, s.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: Discover: %v", i, err)
		}
		sameRows(t, matrix(topo), s.want)
	}
}

func TestTopologyFileCanceledContext(t *testing.T) {
	d, err := NewTopologyFile(fileOptions(filepath.Join("testdata", "p40-pcie-7.txt")))
	if err != nil {
		t.Fatalf("NewTopologyFile: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Discover(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Discover with a canceled context: got %v, want context.Canceled", err)
	}
}
