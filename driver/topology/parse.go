package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// maxLineBytes bounds one line of input. A 64-GPU node with a dozen NICs
// prints well under 2 KiB per line; the bound only stops garbage input from
// growing the scanner buffer without limit.
const maxLineBytes = 64 << 10

// Column names nvidia-smi prints for per-GPU attributes. They contain
// spaces, so a header split on whitespace has to be stitched back together.
const (
	colCPUAffinity  = "CPU Affinity"
	colNUMAAffinity = "NUMA Affinity"
	colGPUNUMAID    = "GPU NUMA ID"
)

// multiWordColumns lists the attribute headers as word sequences, longest
// first so "GPU NUMA ID" is not mistaken for a GPU column followed by junk.
var multiWordColumns = [][]string{
	{"GPU", "NUMA", "ID"},
	{"CPU", "Affinity"},
	{"NUMA", "Affinity"},
}

type columnKind uint8

const (
	// colDevice is a non-GPU PCIe device (a NIC such as mlx5_0 or NIC0):
	// its cells are validated as link classes but not modelled.
	colDevice columnKind = iota
	colGPU
	colAttrCPU
	colAttrNUMA
	colAttrGPUNUMA
)

type column struct {
	name  string
	kind  columnKind
	index int // GPU index for colGPU
}

// rowData is one parsed GPU row, kept until every row is in so that the
// symmetry check can name both lines.
type rowData struct {
	line  int
	links []Link // by GPU column order of the header
	gpu   GPU
}

// ParseFile parses the `nvidia-smi topo -m` output stored at path.
func ParseFile(path string) (*Topology, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read topology file: %w", err)
	}
	defer f.Close()
	t, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads the text `nvidia-smi topo -m` prints and returns the GPUs
// (in ascending index order) and their link matrix.
//
// The parser is deliberately lenient about layout, because the text reaches
// gpulink through copy and paste as often as through a pipe: cells may be
// separated by tabs, runs of spaces or both, the header may be indented,
// ANSI underline sequences (printed on a terminal) and carriage returns are
// dropped. It is strict about content: every GPU needs exactly one row with
// one cell per header column, "X" exactly on the diagonal, known link
// classes, and a symmetric matrix. NIC columns (mlx5_0, NIC0, ...) must
// hold link classes in GPU rows but are otherwise ignored, NIC rows are
// skipped, and everything from the first "Legend:" (or "NIC Legend:") line
// on is skipped.
func Parse(r io.Reader) (*Topology, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)

	var (
		cols       []column
		headerLine int
		gpuCols    []int // header positions of GPU columns
		gpuColOf   map[string]int
		deviceCols map[string]bool
		rows       map[int]*rowData // by GPU column order
	)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		text := stripANSI(sc.Text())
		trimmed := strings.TrimSpace(text)
		if trimmed == "" {
			continue
		}
		if strings.HasSuffix(trimmed, "Legend:") {
			break
		}
		fields := strings.Fields(text)
		if cols == nil {
			var err error
			cols, err = parseHeader(fields)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", lineNo, err)
			}
			headerLine = lineNo
			gpuColOf = make(map[string]int)
			deviceCols = make(map[string]bool)
			for i, c := range cols {
				switch c.kind {
				case colGPU:
					gpuColOf[c.name] = len(gpuCols)
					gpuCols = append(gpuCols, i)
				case colDevice:
					deviceCols[c.name] = true
				}
			}
			rows = make(map[int]*rowData, len(gpuCols))
			continue
		}

		label := fields[0]
		g, isGPU := gpuColOf[label]
		if !isGPU {
			if deviceCols[label] {
				// NIC rows describe NIC-to-GPU paths, which the GPU rows
				// already carry; their affinity cells are often empty, so
				// they are not held to the cell count.
				continue
			}
			return nil, fmt.Errorf("line %d: row %q matches no column of the header (line %d)", lineNo, label, headerLine)
		}
		if prev, dup := rows[g]; dup {
			return nil, fmt.Errorf("line %d: duplicate row %s (first on line %d)", lineNo, label, prev.line)
		}
		row, err := parseGPURow(fields[1:], cols, g, gpuCols)
		if err != nil {
			return nil, fmt.Errorf("line %d, %w", lineNo, err)
		}
		row.line = lineNo
		row.gpu.Index = cols[gpuCols[g]].index
		rows[g] = row
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: read topology: %w", lineNo+1, err)
	}
	if cols == nil {
		return nil, errors.New("no topology matrix found: input has no header line")
	}
	n := len(gpuCols)
	for g, ci := range gpuCols {
		if rows[g] == nil {
			return nil, fmt.Errorf("line %d, column %s: GPU has a column but no row", headerLine, cols[ci].name)
		}
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			ab, ba := rows[a].links[b], rows[b].links[a]
			if ab != ba {
				na, nb := cols[gpuCols[a]].name, cols[gpuCols[b]].name
				return nil, fmt.Errorf("line %d, column %s: asymmetric matrix: %s->%s is %s but %s->%s is %s (line %d)",
					rows[b].line, na, na, nb, ab, nb, na, ba, rows[a].line)
			}
		}
	}

	// Positions follow the GPU index so that a Topology built from a file
	// and one decoded from ResourceSlices line up, whatever column order
	// the header used.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return rows[order[i]].gpu.Index < rows[order[j]].gpu.Index })
	gpus := make([]GPU, n)
	links := make([][]Link, n)
	for p, g := range order {
		gpus[p] = rows[g].gpu
		links[p] = make([]Link, n)
		for q, h := range order {
			if p != q {
				links[p][q] = rows[g].links[h]
			}
		}
	}
	t, err := New(gpus, links)
	if err != nil {
		return nil, fmt.Errorf("line %d: %w", headerLine, err)
	}
	return t, nil
}

// parseHeader classifies the header cells. The corner cell is blank in
// nvidia-smi output, so fields holds column names only.
func parseHeader(fields []string) ([]column, error) {
	var cols []column
	seen := make(map[string]bool)
	gpus := 0
	for i := 0; i < len(fields); {
		name, width := joinMultiWord(fields[i:])
		i += width
		if seen[name] {
			return nil, fmt.Errorf("duplicate column %s", name)
		}
		seen[name] = true
		c := column{name: name}
		switch name {
		case colCPUAffinity:
			c.kind = colAttrCPU
		case colNUMAAffinity:
			c.kind = colAttrNUMA
		case colGPUNUMAID:
			c.kind = colAttrGPUNUMA
		case "X", "CPU", "NUMA", "Affinity", "ID":
			return nil, fmt.Errorf("column %q is not a device or a known attribute; is this the header line?", name)
		default:
			if rest, ok := strings.CutPrefix(name, "GPU"); ok {
				idx, err := parseID(rest)
				if err != nil {
					return nil, fmt.Errorf("column %q: want GPU<index> with a non-negative decimal index", name)
				}
				c.kind, c.index = colGPU, idx
				gpus++
			}
		}
		cols = append(cols, c)
	}
	if gpus == 0 {
		return nil, fmt.Errorf("header has no GPU<n> column (got %q)", strings.Join(fields, " "))
	}
	if gpus > MaxGPUs {
		return nil, fmt.Errorf("header has %d GPU columns, at most %d are supported", gpus, MaxGPUs)
	}
	return cols, nil
}

// joinMultiWord returns the column name starting at fields[0] and how many
// fields it spans.
func joinMultiWord(fields []string) (string, int) {
	for _, words := range multiWordColumns {
		if len(fields) < len(words) {
			continue
		}
		match := true
		for i, w := range words {
			if !strings.EqualFold(fields[i], w) {
				match = false
				break
			}
		}
		if match {
			return strings.Join(words, " "), len(words)
		}
	}
	return fields[0], 1
}

// parseGPURow parses the cells after the row label of the GPU whose column
// is the self-th GPU column. Errors start with the column ("column GPU3:
// ...") so the caller can prefix the line number.
func parseGPURow(cells []string, cols []column, self int, gpuCols []int) (*rowData, error) {
	if len(cells) != len(cols) {
		names := make([]string, len(cols))
		for i, c := range cols {
			names[i] = c.name
		}
		return nil, fmt.Errorf("column %s: row has %d cells, want %d (one per column: %s)",
			cols[gpuCols[self]].name, len(cells), len(cols), strings.Join(names, ", "))
	}
	row := &rowData{links: make([]Link, len(gpuCols)), gpu: GPU{NUMANode: -1}}
	numaAffinity, gpuNUMAID := -1, -1
	g := 0
	for i, c := range cols {
		cell := cells[i]
		switch c.kind {
		case colGPU, colDevice:
			diagonal := c.kind == colGPU && g == self
			if diagonal != (cell == "X") {
				if diagonal {
					return nil, fmt.Errorf("column %s: want %q on the diagonal, got %q", c.name, "X", cell)
				}
				return nil, fmt.Errorf("column %s: %q off the diagonal", c.name, cell)
			}
			if !diagonal {
				l, err := ParseLink(cell)
				if err != nil {
					return nil, fmt.Errorf("column %s: %w", c.name, err)
				}
				if c.kind == colGPU {
					row.links[g] = l
				}
			}
			if c.kind == colGPU {
				g++
			}
		case colAttrCPU:
			if isNA(cell) {
				continue
			}
			if _, _, err := parseIDList(cell); err != nil {
				return nil, fmt.Errorf("column %s: %w", c.name, err)
			}
			row.gpu.CPUAffinity = cell
		case colAttrNUMA, colAttrGPUNUMA:
			node, err := parseNUMACell(cell)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", c.name, err)
			}
			if c.kind == colAttrNUMA {
				numaAffinity = node
			} else {
				gpuNUMAID = node
			}
		}
	}
	// NUMA Affinity is the node of the GPU's PCIe attachment, which is what
	// CPU and NIC alignment care about. GPU NUMA ID only differs on systems
	// that expose GPU memory as its own node (Grace Hopper), so it is the
	// fallback when the affinity is unknown.
	switch {
	case numaAffinity >= 0:
		row.gpu.NUMANode = numaAffinity
	case gpuNUMAID >= 0:
		row.gpu.NUMANode = gpuNUMAID
	}
	return row, nil
}

func isNA(cell string) bool { return strings.EqualFold(cell, "N/A") }

// parseNUMACell returns the single NUMA node a cell names, or -1 when it
// says N/A or lists several nodes (a GPU close to more than one node has
// no single node to align with).
func parseNUMACell(cell string) (int, error) {
	if isNA(cell) {
		return -1, nil
	}
	first, count, err := parseIDList(cell)
	if err != nil {
		return -1, err
	}
	if count != 1 {
		return -1, nil
	}
	return first, nil
}

// parseIDList validates the kernel's list format ("0-13,28-41", "0",
// "3,5") that nvidia-smi uses for CPU and NUMA affinity, returning the
// first ID and how many IDs the list covers. It counts rather than expands
// so that a hostile "0-999999999" costs nothing.
func parseIDList(s string) (first, count int, err error) {
	for i, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseID(lo)
		if err != nil {
			return 0, 0, fmt.Errorf("invalid ID list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = parseID(hi); err != nil {
				return 0, 0, fmt.Errorf("invalid ID list %q: %w", s, err)
			}
			if b < a {
				return 0, 0, fmt.Errorf("invalid ID list %q: range %q runs backwards", s, part)
			}
		}
		if i == 0 {
			first = a
		}
		count += b - a + 1
	}
	return first, count, nil
}

func parseID(s string) (int, error) {
	id, err := strconv.Atoi(s)
	if err != nil || id < 0 || strconv.Itoa(id) != s {
		return 0, fmt.Errorf("%q is not a non-negative decimal ID", s)
	}
	return id, nil
}

// stripANSI removes terminal escape sequences (CSI ... final byte), which
// nvidia-smi uses to underline the header when writing to a terminal, and
// carriage returns left by files saved on Windows.
func stripANSI(s string) string {
	if !strings.ContainsAny(s, "\x1b\r") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\r':
		case c == 0x1b && i+1 < len(s) && s[i+1] == '[':
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j // skips the final byte too; the loop's i++ moves past it
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
