package tracebench

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// sharedTrace is the published trace, present where ../shared is.
const sharedTrace = "../../../shared/traces/openb"

const testTopologies = "../../driver/topology/testdata"

func TestParseTasks(t *testing.T) {
	csv := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n" +
		"a,4000,8192,0,0,,BE\n" +
		"b,8000,16384,1,460,,LS\n" +
		"c,32000,65536,8,1000,V100M16|V100M32,LS\n"
	tasks, err := ParseTasks(strings.NewReader(csv), "tiny.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []Task{
		{Name: "a", CPUMilli: 4000, MemoryMiB: 8192},
		{Name: "b", CPUMilli: 8000, MemoryMiB: 16384, GPUs: 1, GPUMilli: 460},
		{Name: "c", CPUMilli: 32000, MemoryMiB: 65536, GPUs: 8, GPUMilli: 1000, Models: []string{"V100M16", "V100M32"}},
	}
	if !reflect.DeepEqual(tasks, want) {
		t.Fatalf("got %+v\nwant %+v", tasks, want)
	}
	if !tasks[1].Share() || tasks[2].Share() || tasks[2].TotalMilli() != 8000 {
		t.Errorf("Share/TotalMilli wrong: %+v", tasks)
	}
	if !tasks[2].Accepts("V100M32") || tasks[2].Accepts("T4") || !tasks[1].Accepts("T4") {
		t.Errorf("Accepts wrong")
	}
	// The multigpu50 list has no gpu_spec column.
	if _, err := ParseTasks(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,2,1000\n"), "m.csv"); err != nil {
		t.Errorf("list without gpu_spec: %v", err)
	}
}

func TestParseErrorsNameFileLineColumn(t *testing.T) {
	head := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
	for _, tc := range []struct {
		name, csv string
		want      []string
	}{
		{"not a number", head + "a,1,1,0,0,\nb,x,1,0,0,\n", []string{"bad.csv: line 3: column cpu_milli: value \"x\""}},
		{"negative", head + "a,1,-5,0,0,\n", []string{"line 2: column memory_mib", "want 0.."}},
		{"share spans several GPUs", head + "a,1,1,2,500,\n", []string{"line 2: column gpu_milli", "a share spans one GPU"}},
		{"finer than 1 %", head + "a,1,1,1,455,\n", []string{"line 2: column gpu_milli", "multiple of 10"}},
		{"gpu without share", head + "a,1,1,1,0,\n", []string{"column gpu_milli"}},
		{"empty model", head + "a,1,1,1,500,T4||P100\n", []string{"column gpu_spec"}},
		{"missing column", "name,cpu_milli,memory_mib,num_gpu\n", []string{"bad.csv: line 1", "no column \"gpu_milli\""}},
		{"short row", head + "a,1,1\n", []string{"line 2: 3 fields"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTasks(strings.NewReader(tc.csv), "bad.csv")
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	_, err := ParseNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,2,T4\nn1,1,1,2,T4\n"), "nodes.csv")
	if err == nil || !strings.Contains(err.Error(), "nodes.csv: line 3: column sn") || !strings.Contains(err.Error(), "also line 2") {
		t.Errorf("duplicate node: %v", err)
	}
	_, err = ParseNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,99,T4\n"), "nodes.csv")
	if err == nil || !strings.Contains(err.Error(), "column gpu") {
		t.Errorf("too many GPUs: %v", err)
	}
}

func TestLoadMissingDirectory(t *testing.T) {
	_, err := Load("no/such/dir", "default")
	if !errors.Is(err, ErrNoTrace) {
		t.Fatalf("got %v, want ErrNoTrace", err)
	}
}

// TestRealTrace reads the published files where ../shared holds them.
func TestRealTrace(t *testing.T) {
	if _, err := os.Stat(sharedTrace); err != nil {
		t.Skipf("FGD's trace is not at %s: skipping the real-file checks", sharedTrace)
	}
	for _, list := range []string{"default", "multigpu50", "gpushare100"} {
		tr, err := Load(sharedTrace, list)
		if err != nil {
			t.Fatalf("%s: %v", list, err)
		}
		gpus := 0
		for _, n := range tr.Nodes {
			gpus += n.GPUs
		}
		if len(tr.Nodes) != 1213 || gpus != 6212 {
			t.Errorf("%s: %d nodes, %d GPUs; the paper's cluster has 1213 and 6212", list, len(tr.Nodes), gpus)
		}
		if len(tr.Tasks) < 8000 {
			t.Errorf("%s: only %d tasks", list, len(tr.Tasks))
		}
		ks := newKindSet(testTopologies)
		if _, err := newCluster(tr.Nodes, ks); err != nil {
			t.Errorf("%s: every node model maps to a topology: %v", list, err)
		}
	}
}
