package grafana

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/kubeletplugin"
)

// The per-pod panels join dcgm-exporter's series to the kubelet plugin's
// gpulink_kubeletplugin_prepared_gpu_info on the GPU's UUID. Prometheus
// itself (github.com/prometheus/prometheus/promql) would bring its TSDB
// and a few dozen modules into go.mod for one test, so this file
// evaluates the small part of PromQL the joins use (aggregations by
// labels, * and / with on () and group_left/group_right, numbers,
// selectors) with PromQL's vector matching rules, over DCGM-shaped series
// and info series carrying exactly the labels the plugin exports
// (kubeletplugin.PreparedGPUInfoLabels; the plugin's own test checks that
// its gathered series have those labels). A query outside that subset
// fails the test, so a new panel is either checkable here or changes it.

// series is one sample of an instant vector.
type series struct {
	labels map[string]string
	value  float64
}

func (s series) key(names []string) string {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + s.labels[n]
	}
	return strings.Join(parts, ",")
}

func (s series) String() string {
	names := slices.Sorted(maps.Keys(s.labels))
	return fmt.Sprintf("{%s} %g", series{labels: s.labels}.key(names), s.value)
}

// node is a parsed expression.
type node interface {
	eval(db map[string][]series) ([]series, error)
}

type selector struct {
	name     string
	matchers map[string]*regexp.Regexp
}

type number float64

type aggregate struct {
	op  string // sum, max, count
	by  []string
	arg node
}

type binary struct {
	op          byte // '*' or '/'
	lhs, rhs    node
	on          []string // nil: no on ()
	hasOn       bool
	group       string // "", "group_left", "group_right"
	groupLabels []string
}

// parser is a recursive-descent parser of the subset.
type parser struct {
	toks []string
	pos  int
}

var tokenRE = regexp.MustCompile(`\s*("(?:[^"\\]|\\.)*"|=~|!=|[A-Za-z_:][A-Za-z0-9_:]*|[0-9.]+|[(){},*/=])`)

func parse(expr string) (node, error) {
	var toks []string
	rest := expr
	for strings.TrimSpace(rest) != "" {
		m := tokenRE.FindStringSubmatchIndex(rest)
		if m == nil || m[0] != 0 {
			return nil, fmt.Errorf("cannot tokenize %q", rest)
		}
		toks = append(toks, rest[m[2]:m[3]])
		rest = rest[m[1]:]
	}
	p := &parser{toks: toks}
	n, err := p.expr()
	if err != nil {
		return nil, err
	}
	if p.pos != len(p.toks) {
		return nil, fmt.Errorf("unexpected %q after the expression", p.toks[p.pos])
	}
	return n, nil
}

func (p *parser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return ""
}

func (p *parser) next() string {
	t := p.peek()
	p.pos++
	return t
}

func (p *parser) expect(t string) error {
	if got := p.next(); got != t {
		return fmt.Errorf("expected %q, got %q", t, got)
	}
	return nil
}

func (p *parser) labelList() ([]string, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	var out []string
	for p.peek() != ")" {
		out = append(out, p.next())
		if p.peek() == "," {
			p.next()
		}
	}
	p.next()
	return out, nil
}

func (p *parser) expr() (node, error) {
	lhs, err := p.term()
	if err != nil {
		return nil, err
	}
	for p.peek() == "*" || p.peek() == "/" {
		b := &binary{op: p.next()[0], lhs: lhs}
		if p.peek() == "on" {
			p.next()
			b.hasOn = true
			if b.on, err = p.labelList(); err != nil {
				return nil, err
			}
		}
		if g := p.peek(); g == "group_left" || g == "group_right" {
			b.group = p.next()
			if p.peek() == "(" {
				if b.groupLabels, err = p.labelList(); err != nil {
					return nil, err
				}
			}
		}
		if b.rhs, err = p.term(); err != nil {
			return nil, err
		}
		lhs = b
	}
	return lhs, nil
}

func (p *parser) term() (node, error) {
	t := p.next()
	switch {
	case t == "(":
		n, err := p.expr()
		if err != nil {
			return nil, err
		}
		return n, p.expect(")")
	case t == "sum" || t == "max" || t == "count":
		a := &aggregate{op: t}
		if p.peek() == "by" {
			p.next()
			var err error
			if a.by, err = p.labelList(); err != nil {
				return nil, err
			}
		}
		if err := p.expect("("); err != nil {
			return nil, err
		}
		var err error
		if a.arg, err = p.expr(); err != nil {
			return nil, err
		}
		return a, p.expect(")")
	case t != "" && (t[0] >= '0' && t[0] <= '9'):
		v, err := strconv.ParseFloat(t, 64)
		return number(v), err
	case regexp.MustCompile(`^[A-Za-z_:][A-Za-z0-9_:]*$`).MatchString(t):
		s := &selector{name: t, matchers: map[string]*regexp.Regexp{}}
		if p.peek() != "{" {
			return s, nil
		}
		p.next()
		for p.peek() != "}" {
			name, op, val := p.next(), p.next(), p.next()
			v, err := strconv.Unquote(val)
			if err != nil {
				return nil, fmt.Errorf("label %s: value %s: %w", name, val, err)
			}
			// Grafana variables stand for their All value here.
			v = regexp.MustCompile(`\$\w+`).ReplaceAllString(v, ".*")
			switch op {
			case "=":
				v = regexp.QuoteMeta(v)
			case "=~":
			default:
				return nil, fmt.Errorf("label %s: matcher %q is not in the subset", name, op)
			}
			s.matchers[name] = regexp.MustCompile("^(?:" + v + ")$")
			if p.peek() == "," {
				p.next()
			}
		}
		p.next()
		return s, nil
	}
	return nil, fmt.Errorf("%q is not in the PromQL subset this test evaluates", t)
}

func (s *selector) eval(db map[string][]series) ([]series, error) {
	var out []series
	for _, x := range db[s.name] {
		ok := true
		for name, re := range s.matchers {
			if !re.MatchString(x.labels[name]) {
				ok = false
			}
		}
		if ok {
			l := maps.Clone(x.labels)
			l["__name__"] = s.name
			out = append(out, series{labels: l, value: x.value})
		}
	}
	return out, nil
}

func (n number) eval(map[string][]series) ([]series, error) {
	return []series{{value: float64(n)}}, nil
}

func (a *aggregate) eval(db map[string][]series) ([]series, error) {
	in, err := a.arg.eval(db)
	if err != nil {
		return nil, err
	}
	groups := map[string]*series{}
	var order []string
	for _, x := range in {
		k := x.key(a.by)
		g := groups[k]
		if g == nil {
			l := map[string]string{}
			for _, n := range a.by {
				if v := x.labels[n]; v != "" {
					l[n] = v
				}
			}
			g = &series{labels: l, value: math.Inf(-1)}
			if a.op != "max" {
				g.value = 0
			}
			groups[k] = g
			order = append(order, k)
		}
		switch a.op {
		case "sum":
			g.value += x.value
		case "max":
			g.value = max(g.value, x.value)
		case "count":
			g.value++
		}
	}
	out := make([]series, 0, len(order))
	for _, k := range order {
		out = append(out, *groups[k])
	}
	return out, nil
}

func isScalar(n node) bool { _, ok := n.(number); return ok }

func apply(op byte, l, r float64) float64 {
	if op == '*' {
		return l * r
	}
	return l / r
}

// eval follows PromQL's vector matching: without group_*, one-to-one;
// with group_left the right side, with group_right the left side must be
// unique per matching labels, and the result keeps the other side's
// labels (plus the listed group labels of the unique side).
func (b *binary) eval(db map[string][]series) ([]series, error) {
	lhs, err := b.lhs.eval(db)
	if err != nil {
		return nil, err
	}
	rhs, err := b.rhs.eval(db)
	if err != nil {
		return nil, err
	}
	dropName := func(l map[string]string) map[string]string {
		l = maps.Clone(l)
		delete(l, "__name__")
		return l
	}
	if isScalar(b.lhs) || isScalar(b.rhs) {
		var out []series
		vec, s, scalarLeft := rhs, lhs[0].value, true
		if isScalar(b.rhs) {
			vec, s, scalarLeft = lhs, rhs[0].value, false
		}
		for _, x := range vec {
			v := apply(b.op, x.value, s)
			if scalarLeft {
				v = apply(b.op, s, x.value)
			}
			out = append(out, series{labels: dropName(x.labels), value: v})
		}
		return out, nil
	}
	if !b.hasOn {
		return nil, fmt.Errorf("vector %c vector without on (): not in the subset (match on explicit labels)", b.op)
	}
	sig := func(x series) string { return x.key(b.on) }
	one, many, manyLeft := rhs, lhs, true
	if b.group == "group_right" {
		one, many, manyLeft = lhs, rhs, false
	}
	ones := map[string]series{}
	for _, x := range one {
		if prev, dup := ones[sig(x)]; dup {
			side := "right"
			if !manyLeft {
				side = "left"
			}
			if b.group == "" {
				side = "one-to-one"
			}
			return nil, fmt.Errorf("found duplicate series for the match group {%s} on the %s hand-side of the operation: %v and %v; many-to-many matching not allowed", sig(x), side, prev, x)
		}
		ones[sig(x)] = x
	}
	seen := map[string]bool{}
	var out []series
	for _, m := range many {
		o, ok := ones[sig(m)]
		if !ok {
			continue
		}
		l := dropName(m.labels)
		if b.group == "" {
			l = map[string]string{}
			for _, n := range b.on {
				if v := m.labels[n]; v != "" {
					l[n] = v
				}
			}
			if seen[sig(m)] {
				return nil, fmt.Errorf("multiple matches for labels {%s}: many-to-one matching must be explicit (group_left/group_right)", sig(m))
			}
		}
		for _, n := range b.groupLabels {
			if v := o.labels[n]; v != "" {
				l[n] = v
			} else {
				delete(l, n)
			}
		}
		k := series{labels: l}.String()
		if seen[k] {
			return nil, fmt.Errorf("multiple matches for labels %s: grouping labels must ensure unique matches", k)
		}
		seen[k], seen[sig(m)] = true, true
		v := apply(b.op, m.value, o.value)
		if !manyLeft {
			v = apply(b.op, o.value, m.value)
		}
		out = append(out, series{labels: l, value: v})
	}
	return out, nil
}

// dcgmLabels are the labels dcgm-exporter (3.x, 4.x) puts on a GPU's
// series, plus the target labels its ServiceMonitor (honorLabels) adds.
var dcgmLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "namespace", "pod", "instance", "job"}

// dcgmDB is a node with three GPUs seen by dcgm-exporter, and the plugin's
// info series: gpu-0 whole for pod a/train-0; gpu-1 in MPS shares of
// a/web-0 and of claim b/shared used by pods b/q-0 and b/q-1; gpu-2 idle.
// Every info series comes twice, from two plugin pods scraped side by side
// during a rolling upgrade.
func dcgmDB(t *testing.T) (db map[string][]series, util map[int]float64) {
	t.Helper()
	uuid := func(i int) string { return fmt.Sprintf("GPU-%08d-1111-2222-3333-444444444444", i) }
	util = map[int]float64{0: 90, 1: 40, 2: 0}
	fbMiB := map[int]float64{0: 30000, 1: 12000, 2: 0}
	db = map[string][]series{}
	for i := range 3 {
		l := map[string]string{
			"gpu": strconv.Itoa(i), "UUID": uuid(i), "pci_bus_id": fmt.Sprintf("00000000:%02X:00.0", 0x10+i),
			"device": fmt.Sprintf("nvidia%d", i), "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-a",
			"DCGM_FI_DRIVER_VERSION": "550.54.15", "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p",
			"instance": "10.0.0.7:9400", "job": "nvidia-dcgm-exporter",
		}
		if got := slices.Sorted(maps.Keys(l)); !slices.Equal(got, slices.Sorted(slices.Values(dcgmLabels))) {
			t.Fatalf("DCGM series labels %v, want %v", got, dcgmLabels)
		}
		db["DCGM_FI_DEV_GPU_UTIL"] = append(db["DCGM_FI_DEV_GPU_UTIL"], series{labels: l, value: util[i]})
		db["DCGM_FI_DEV_FB_USED"] = append(db["DCGM_FI_DEV_FB_USED"], series{labels: l, value: fbMiB[i]})
	}
	info := func(gpu int, ns, pod, claim, kind, strategy, mem, cores string) map[string]string {
		values := map[string]string{
			"node": "node-a", "gpu": fmt.Sprintf("gpu-%d", gpu), "UUID": uuid(gpu), "namespace": ns, "pod": pod,
			"claim": claim, "kind": kind, "strategy": strategy, "share_memory_bytes": mem, "share_cores": cores,
		}
		l := map[string]string{}
		for _, n := range kubeletplugin.PreparedGPUInfoLabels {
			v, ok := values[n]
			if !ok {
				t.Fatalf("the plugin exports label %s, which this test does not fill in", n)
			}
			if v != "" {
				l[n] = v
			}
		}
		if len(values) != len(kubeletplugin.PreparedGPUInfoLabels) {
			t.Fatalf("this test fills in labels %v, the plugin exports %v", slices.Sorted(maps.Keys(values)), kubeletplugin.PreparedGPUInfoLabels)
		}
		return l
	}
	infos := []map[string]string{
		info(0, "a", "train-0", "train", "whole", "", "", ""),
		info(1, "a", "web-0", "web", "share", "MPS", "8589934592", "30"),
		info(1, "b", "q-0", "shared", "share", "MPS", "17179869184", "50"),
		info(1, "b", "q-1", "shared", "share", "MPS", "17179869184", "50"),
	}
	for _, inst := range []string{"10.0.0.7:8082", "10.0.0.8:8082"} {
		for _, l := range infos {
			l = maps.Clone(l)
			l["instance"], l["job"] = inst, "kubelet-plugin"
			db[kubeletplugin.PreparedGPUInfoName] = append(db[kubeletplugin.PreparedGPUInfoName], series{labels: l, value: 1})
		}
	}
	return db, util
}

// dashboardTargets returns every target of the dashboard with its panel.
func dashboardTargets(t *testing.T) map[string]map[string]any {
	t.Helper()
	raw, err := os.ReadFile("gpulink.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string           `json:"title"`
			Targets []map[string]any `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("%s/%v", p.Title, tg["refId"])] = tg
		}
	}
	return out
}

func resultKeys(s []series) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.String()
	}
	sort.Strings(out)
	return out
}

func TestDashboardJoinsDCGMByUUID(t *testing.T) {
	db, util := dcgmDB(t)
	// What each joining panel must show for the node above.
	want := map[string][]string{
		"GPU utilization by pod/A": {
			"{UUID=GPU-00000000-1111-2222-3333-444444444444,gpu=gpu-0,namespace=a,node=node-a,pod=train-0} 90",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=a,node=node-a,pod=web-0} 40",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=b,node=node-a,pod=q-0} 40",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=b,node=node-a,pod=q-1} 40",
		},
		"GPU memory used by pod/A": {
			"{UUID=GPU-00000000-1111-2222-3333-444444444444,gpu=gpu-0,namespace=a,node=node-a,pod=train-0} 3.145728e+10",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=a,node=node-a,pod=web-0} 1.2582912e+10",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=b,node=node-a,pod=q-0} 1.2582912e+10",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,gpu=gpu-1,namespace=b,node=node-a,pod=q-1} 1.2582912e+10",
		},
		// gpu-1 counts once for b although two of its pods use it.
		"Busy GPUs by namespace/A": {
			fmt.Sprintf("{namespace=a} %g", (util[0]+util[1])/100),
			fmt.Sprintf("{namespace=b} %g", util[1]/100),
		},
		"GPUs by namespace/A": {"{namespace=a} 2", "{namespace=b} 1"},
		"Prepared GPUs by pod/A": {
			"{UUID=GPU-00000000-1111-2222-3333-444444444444,claim=train,gpu=gpu-0,kind=whole,namespace=a,node=node-a,pod=train-0} 1",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,claim=shared,gpu=gpu-1,kind=share,namespace=b,node=node-a,pod=q-0,share_cores=50,share_memory_bytes=17179869184,strategy=MPS} 1",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,claim=shared,gpu=gpu-1,kind=share,namespace=b,node=node-a,pod=q-1,share_cores=50,share_memory_bytes=17179869184,strategy=MPS} 1",
			"{UUID=GPU-00000001-1111-2222-3333-444444444444,claim=web,gpu=gpu-1,kind=share,namespace=a,node=node-a,pod=web-0,share_cores=30,share_memory_bytes=8589934592,strategy=MPS} 1",
		},
	}
	targets := dashboardTargets(t)
	infoLabels := map[string]bool{}
	for _, n := range kubeletplugin.PreparedGPUInfoLabels {
		infoLabels[n] = true
	}
	checked := 0
	for name, tg := range targets {
		expr, _ := tg["expr"].(string)
		if !strings.Contains(expr, kubeletplugin.PreparedGPUInfoName) {
			continue
		}
		checked++
		n, err := parse(expr)
		if err != nil {
			t.Errorf("%s: %q: %v", name, expr, err)
			continue
		}
		// Every label a query names must be one the plugin exports (or,
		// in the aggregation of a DCGM series, DCGM's UUID).
		for _, m := range regexp.MustCompile(`\b(?:by|on|group_left|group_right)\s*\(([^)]*)\)`).FindAllStringSubmatch(expr, -1) {
			for l := range strings.SplitSeq(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !infoLabels[l] {
					t.Errorf("%s: %q groups or matches by %s, which %s does not have (labels %v)", name, expr, l, kubeletplugin.PreparedGPUInfoName, kubeletplugin.PreparedGPUInfoLabels)
				}
			}
		}
		if strings.Contains(expr, "DCGM_FI_") && !regexp.MustCompile(`\* on \(UUID\) group_right `).MatchString(expr) {
			t.Errorf("%s: %q joins DCGM series other than with `* on (UUID) group_right`", name, expr)
		}
		got, err := n.eval(db)
		if err != nil {
			t.Errorf("%s: %q: %v", name, expr, err)
			continue
		}
		keys := resultKeys(got)
		if w, ok := want[name]; !ok {
			t.Errorf("%s: %q evaluates to %q; add what it must show to this test", name, expr, keys)
		} else if !slices.Equal(keys, w) {
			t.Errorf("%s: %q:\ngot  %q\nwant %q", name, expr, keys, w)
		}
		// The legend names only labels the result has.
		legend, _ := tg["legendFormat"].(string)
		for _, m := range regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`).FindAllStringSubmatch(legend, -1) {
			for _, s := range got {
				if _, ok := s.labels[m[1]]; !ok {
					t.Errorf("%s: legend %q uses {{%s}}, which the result %v lacks", name, legend, m[1], s)
					break
				}
			}
		}
	}
	if checked < len(want) {
		t.Errorf("checked %d queries on %s, want at least %d", checked, kubeletplugin.PreparedGPUInfoName, len(want))
	}
}

// TestJoinShapes is why the panels join as they do: with the info series
// as the "one" side (group_left), a GPU used by several pods breaks the
// query, as it would in Prometheus; without max by () on the info side,
// every pod shows twice while two plugin pods are scraped side by side.
func TestJoinShapes(t *testing.T) {
	db, _ := dcgmDB(t)
	for _, c := range []struct {
		expr    string
		wantErr string
		want    int
	}{
		{expr: `DCGM_FI_DEV_GPU_UTIL * on (UUID) group_left (namespace, pod) max by (UUID, namespace, pod) (gpulink_kubeletplugin_prepared_gpu_info)`,
			wantErr: "duplicate series for the match group {UUID=GPU-00000001"},
		{expr: `DCGM_FI_DEV_GPU_UTIL * on (UUID) group_right gpulink_kubeletplugin_prepared_gpu_info`, want: 8},
		{expr: `max by (UUID) (DCGM_FI_DEV_GPU_UTIL) * on (UUID) group_right max by (UUID, namespace, pod) (gpulink_kubeletplugin_prepared_gpu_info)`, want: 4},
	} {
		n, err := parse(c.expr)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		got, err := n.eval(db)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%q: %v", c.expr, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", c.expr, err, c.wantErr)
		case c.wantErr == "" && len(got) != c.want:
			t.Errorf("%q: %d series, want %d: %q", c.expr, len(got), c.want, resultKeys(got))
		}
	}
}
