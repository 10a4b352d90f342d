package tracebench

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MilliPerGPU is one whole GPU in the trace's gpu_milli unit.
const MilliPerGPU = 1000

// shareGranularity is the smallest step of a share gpulink can express:
// ShareRequest.Cores is a whole percent of the GPU, 10 milli. Every share
// in the published trace is a multiple of it; a value that is not would
// be rounded by gpulink and not by the baselines, so it is refused.
const shareGranularity = 10

// Node is one row of openb_node_list_gpu_node.csv.
type Node struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// Task is one row of an openb_pod_list_*.csv file.
type Task struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// GPUs is num_gpu: 0 for a CPU-only task.
	GPUs int
	// GPUMilli is gpu_milli, the share of each GPU the task takes: 1000
	// for whole GPUs, less for a share of one GPU.
	GPUMilli int
	// Models is gpu_spec split at "|": the GPU models the task may run
	// on; empty means any.
	Models []string
}

// Share tells whether the task asks for part of one GPU.
func (t *Task) Share() bool { return t.GPUs == 1 && t.GPUMilli < MilliPerGPU }

// TotalMilli is the task's GPU request in milli GPUs, what the arrival
// counter adds up.
func (t *Task) TotalMilli() int64 { return int64(t.GPUs) * int64(t.GPUMilli) }

// Accepts tells whether the task may run on GPUs of the model.
func (t *Task) Accepts(model string) bool {
	if len(t.Models) == 0 {
		return true
	}
	for _, m := range t.Models {
		if m == model {
			return true
		}
	}
	return false
}

// Trace is the node list and one task list.
type Trace struct {
	Nodes []Node
	Tasks []Task
	// List names the task list ("default", "multigpu50", ...).
	List string
}

// NodeFile and TaskFile name the trace's files inside its directory.
const NodeFile = "openb_node_list_gpu_node.csv"

// TaskFile is the file of a task list ("default" → openb_pod_list_default.csv).
func TaskFile(list string) string { return "openb_pod_list_" + list + ".csv" }

// ErrNoTrace is returned (wrapped) by Load when the trace directory does
// not exist, so callers can skip instead of fail.
var ErrNoTrace = errors.New("trace directory not found")

// Load reads the node list and the task list named list from dir. A list
// whose file is not there and whose name is BASE-specNN[u] is made from
// BASE's file with GPU-model constraints (gpuspec.go).
func Load(dir, list string) (*Trace, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s", ErrNoTrace, dir)
	}
	nodes, err := readFile(filepath.Join(dir, NodeFile), ParseNodes)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, TaskFile(list))
	if _, statErr := os.Stat(path); statErr != nil {
		base, percent, uniform, ok, err := parseSpecName(list)
		if err != nil {
			return nil, err
		}
		if ok {
			tasks, err := readFile(filepath.Join(dir, TaskFile(base)), ParseTasks)
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", list, err)
			}
			if tasks, err = WithModelConstraints(nodes, tasks, percent, uniform, list); err != nil {
				return nil, err
			}
			return &Trace{Nodes: nodes, Tasks: tasks, List: list}, nil
		}
	}
	tasks, err := readFile(path, ParseTasks)
	if err != nil {
		return nil, err
	}
	return &Trace{Nodes: nodes, Tasks: tasks, List: list}, nil
}

func readFile[T any](path string, parse func(io.Reader, string) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	return parse(f, path)
}

// table is a CSV file read by column name, so the lists' different column
// sets (multigpu50 has no gpu_spec) need no special cases.
type table struct {
	file string
	r    *csv.Reader
	col  map[string]int
	row  []string
	line int
}

func newTable(r io.Reader, file string, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // checked per row, to name the line
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: line 1: header: %w", file, err)
	}
	t := &table{file: file, r: cr, col: map[string]int{}}
	for i, h := range head {
		t.col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, name := range required {
		if _, ok := t.col[name]; !ok {
			return nil, fmt.Errorf("%s: line 1: header has no column %q (columns: %s)", file, name, strings.Join(head, ","))
		}
	}
	return t, nil
}

// next reads a row; io.EOF at the end.
func (t *table) next() error {
	row, err := t.r.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return fmt.Errorf("%s: %w", t.file, err)
	}
	t.line, _ = t.r.FieldPos(0)
	if len(row) != len(t.col) {
		return fmt.Errorf("%s: line %d: %d fields, the header has %d", t.file, t.line, len(row), len(t.col))
	}
	t.row = row
	return nil
}

// str returns a column's value ("" for a column the file lacks).
func (t *table) str(name string) string {
	i, ok := t.col[name]
	if !ok {
		return ""
	}
	return strings.TrimSpace(t.row[i])
}

// errf names file, line, column and value of a bad cell.
func (t *table) errf(name string, err error) error {
	return fmt.Errorf("%s: line %d: column %s: value %q: %w", t.file, t.line, name, t.str(name), err)
}

// int reads a non-negative integer column no larger than limit.
func (t *table) int(name string, limit int64) (int64, error) {
	v, err := strconv.ParseInt(t.str(name), 10, 64)
	if err != nil {
		return 0, t.errf(name, err)
	}
	if v < 0 || v > limit {
		return 0, t.errf(name, fmt.Errorf("want 0..%d", limit))
	}
	return v, nil
}

// Limits that keep every sum of the replay in int64 and catch unit mix-ups
// (bytes where MiB belong) early.
const (
	maxCPUMilli  = 1 << 30
	maxMemoryMiB = 1 << 34
	maxNodeGPUs  = 16
)

// ParseNodes reads a node list; file names the source in errors.
func ParseNodes(r io.Reader, file string) ([]Node, error) {
	t, err := newTable(r, file, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	var out []Node
	seen := map[string]int{}
	for {
		if err := t.next(); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		n := Node{Name: t.str("sn"), Model: t.str("model")}
		if n.Name == "" {
			return nil, t.errf("sn", errors.New("empty node name"))
		}
		if at, dup := seen[n.Name]; dup {
			return nil, t.errf("sn", fmt.Errorf("duplicate node name (also line %d)", at))
		}
		seen[n.Name] = t.line
		if n.CPUMilli, err = t.int("cpu_milli", maxCPUMilli); err != nil {
			return nil, err
		}
		if n.MemoryMiB, err = t.int("memory_mib", maxMemoryMiB); err != nil {
			return nil, err
		}
		g, err := t.int("gpu", maxNodeGPUs)
		if err != nil {
			return nil, err
		}
		n.GPUs = int(g)
		if n.GPUs > 0 && n.Model == "" {
			return nil, t.errf("model", errors.New("a GPU node needs a model"))
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no nodes", file)
	}
	return out, nil
}

// ParseTasks reads a task list; file names the source in errors. Columns
// the replay does not use (qos, phases, times) are not read: the paper's
// inflation draws tasks regardless of how they ended in production.
func ParseTasks(r io.Reader, file string) ([]Task, error) {
	t, err := newTable(r, file, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	var out []Task
	for {
		if err := t.next(); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		k := Task{Name: t.str("name")}
		if k.CPUMilli, err = t.int("cpu_milli", maxCPUMilli); err != nil {
			return nil, err
		}
		if k.MemoryMiB, err = t.int("memory_mib", maxMemoryMiB); err != nil {
			return nil, err
		}
		g, err := t.int("num_gpu", maxNodeGPUs)
		if err != nil {
			return nil, err
		}
		m, err := t.int("gpu_milli", MilliPerGPU)
		if err != nil {
			return nil, err
		}
		k.GPUs, k.GPUMilli = int(g), int(m)
		switch {
		case k.GPUs == 0 && k.GPUMilli != 0:
			return nil, t.errf("gpu_milli", errors.New("a task with num_gpu 0 asks for no GPU share"))
		case k.GPUs > 0 && k.GPUMilli == 0:
			return nil, t.errf("gpu_milli", fmt.Errorf("num_gpu %d needs gpu_milli 1..%d", k.GPUs, MilliPerGPU))
		case k.GPUs > 1 && k.GPUMilli != MilliPerGPU:
			return nil, t.errf("gpu_milli", fmt.Errorf("num_gpu %d takes whole GPUs (gpu_milli %d); a share spans one GPU", k.GPUs, MilliPerGPU))
		case k.GPUMilli%shareGranularity != 0:
			return nil, t.errf("gpu_milli", fmt.Errorf("not a multiple of %d (1 %% of a GPU, what a gpulink share can express)", shareGranularity))
		}
		if spec := t.str("gpu_spec"); spec != "" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m == "" {
					return nil, t.errf("gpu_spec", errors.New("empty model in the list"))
				}
				k.Models = append(k.Models, m)
			}
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tasks", file)
	}
	return out, nil
}
