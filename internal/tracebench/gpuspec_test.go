package tracebench

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/gpulink/gpulink/driver/allocate"
)

// specTestNodes is a small cluster of three models: 8-GPU G2 nodes with
// 96 cores, 2-GPU T4 nodes and one V100M32 node with 8 GPUs.
func specTestNodes() []Node {
	var nodes []Node
	for i := range 6 {
		nodes = append(nodes, Node{Name: "g2-" + itoa(int64(i)), CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "G2"})
	}
	for i := range 8 {
		nodes = append(nodes, Node{Name: "t4-" + itoa(int64(i)), CPUMilli: 32000, MemoryMiB: 128 << 10, GPUs: 2, Model: "T4"})
	}
	return append(nodes, Node{Name: "v100", CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "V100M32"})
}

func specTestTasks() []Task {
	var tasks []Task
	for i := range 400 {
		t := Task{Name: "t" + itoa(int64(i)), CPUMilli: 4000, MemoryMiB: 8192}
		switch i % 4 {
		case 1:
			t.GPUs, t.GPUMilli = 1, 1000
		case 2:
			t.GPUs, t.GPUMilli = 1, 500
		case 3:
			// Only 8-GPU nodes hold it: never pinned to T4.
			t.GPUs, t.GPUMilli = 4, 1000
		}
		tasks = append(tasks, t)
	}
	return tasks
}

// TestWithModelConstraints: the share of GPU tasks asked for is pinned,
// CPU-only tasks never are, every pin names models of which a node could
// hold the task, the draw depends on the list's name only, and the input
// is left as it was.
func TestWithModelConstraints(t *testing.T) {
	nodes, tasks := specTestNodes(), specTestTasks()
	orig := slices.Clone(tasks)
	for _, uniform := range []bool{false, true} {
		got, err := WithModelConstraints(nodes, tasks, 33, uniform, "x-spec33")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(tasks, orig) {
			t.Fatal("the input tasks changed")
		}
		pinned, models := 0, map[string]int{}
		for i, k := range got {
			if len(k.Models) == 0 {
				continue
			}
			pinned++
			if k.GPUs == 0 {
				t.Fatalf("CPU-only task %s pinned to %v", k.Name, k.Models)
			}
			if k.GPUs == 4 && slices.Contains(k.Models, "T4") {
				t.Fatalf("4-GPU task %s pinned to T4, whose nodes have 2 GPUs", k.Name)
			}
			models[allocate.ProductsKey(k.Models)]++
			k.Models = nil
			if !reflect.DeepEqual(k, orig[i]) {
				t.Fatalf("task %d changed besides its models: %+v, was %+v", i, k, orig[i])
			}
		}
		if want := (300*33 + 50) / 100; pinned != want {
			t.Errorf("uniform=%v: %d tasks pinned, want 33 %% of the 300 GPU tasks, %d", uniform, pinned, want)
		}
		// By supply G2 has 48 of the 68 GPUs: most pins. Uniformly over
		// models the few V100M32 GPUs get about as many pins as G2.
		g2, v100 := models["G2"], models["V100M32"]+models["V100M16|V100M32"]
		if !uniform && g2 < 3*v100 {
			t.Errorf("by supply: G2 pinned %d times, V100 %d; want G2 well ahead (%v)", g2, v100, models)
		}
		if uniform && g2 > 2*v100 {
			t.Errorf("uniform: G2 pinned %d times, V100 %d; want them close (%v)", g2, v100, models)
		}
		again, err := WithModelConstraints(nodes, tasks, 33, uniform, "x-spec33")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(again, got) {
			t.Error("the same name drew a different list")
		}
	}
	if _, err := WithModelConstraints(nodes, tasks, 0, false, "x-spec0"); err == nil {
		t.Error("0 % accepted")
	}
}

// TestLoadGeneratesSpecLists: a BASE-specNN list whose file is absent is
// BASE's file with NN % of its GPU tasks pinned; a list file of that name,
// when there, is read as it is (the artifact's own gpuspec lists).
func TestLoadGeneratesSpecLists(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(NodeFile, "sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,2,P100\nb,96000,393216,8,G2\n")
	body := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
	for i := range 100 {
		body += "p" + itoa(int64(i)) + ",4000,8192,1,1000,\n"
	}
	write(TaskFile("base"), body)
	tr, err := Load(dir, "base-spec20u")
	if err != nil {
		t.Fatal(err)
	}
	pinned := 0
	for _, k := range tr.Tasks {
		if len(k.Models) > 0 {
			pinned++
		}
	}
	if pinned != 20 || tr.List != "base-spec20u" {
		t.Fatalf("list %s: %d of 100 pinned, want 20", tr.List, pinned)
	}
	write(TaskFile("base-spec20u"), "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nq,1000,1024,1,1000,G2\n")
	if tr, err = Load(dir, "base-spec20u"); err != nil || len(tr.Tasks) != 1 {
		t.Fatalf("a list file of the name is read as it is: %d tasks, %v", len(tr.Tasks), err)
	}
	if _, err := Load(dir, "missing-spec20"); err == nil || errors.Is(err, ErrNoTrace) {
		t.Errorf("missing base list: %v", err)
	}
	if _, err := Load(dir, "base-spec0"); err == nil {
		t.Error("a 0 % list accepted")
	}
}
