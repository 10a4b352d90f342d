// Package grafana holds the Grafana dashboard of gpulink (gpulink.json);
// its test checks that every query names metrics the binaries register.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/kubeletplugin"
)

// describingRegistry records the descriptors of every collector registered,
// so metric vectors that have no series yet are known too.
type describingRegistry struct {
	*prometheus.Registry
	names map[string]bool
}

func (r *describingRegistry) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		// Desc has no accessor for its name; its String form has been
		// `Desc{fqName: "...", ...}` since client_golang 0.9.
		m := fqNameRE.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("no fqName in descriptor %s", d)
		}
		r.names[m[1]] = true
	}
	return r.Registry.Register(c)
}

func (r *describingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredNames returns every series name PromQL may use for the metrics
// controller.NewMetrics and kubeletplugin.NewMetrics register: a histogram
// as name_bucket, name_sum, name_count; everything else by its name.
func registeredNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, register := range []func(prometheus.Registerer){
		func(r prometheus.Registerer) { controller.NewMetrics(r) },
		func(r prometheus.Registerer) { kubeletplugin.NewMetrics(r) },
	} {
		reg := &describingRegistry{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
		register(reg)
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		typed := map[string]bool{}
		for _, f := range families {
			typed[f.GetName()] = true
			switch f.GetType().String() {
			case "HISTOGRAM", "GAUGE_HISTOGRAM":
				names[f.GetName()+"_bucket"] = true
				names[f.GetName()+"_sum"] = true
				names[f.GetName()+"_count"] = true
			case "SUMMARY":
				names[f.GetName()] = true
				names[f.GetName()+"_sum"] = true
				names[f.GetName()+"_count"] = true
			default:
				names[f.GetName()] = true
			}
		}
		// Vectors without series and scrape-time collectors are not
		// gathered from a fresh registry; their type is unknown here, so
		// only the bare name is allowed (histograms are all gathered).
		for n := range reg.names {
			if !typed[n] {
				names[n] = true
			}
		}
	}
	return names
}

// promqlKeywords are identifiers of PromQL that are not metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
	"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "atan2": true,
	// Aggregation operators, which may be followed by a grouping clause
	// rather than their parenthesis.
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// groupingKeywords are followed by a parenthesized list of label names.
var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// metricNames returns the metric names a PromQL expression selects: the
// identifiers outside strings, label matchers ({...}), ranges ([...]) and
// grouping lists that are not functions, keywords, numbers, durations or
// Grafana variables.
func metricNames(expr string) ([]string, error) {
	var names []string
	depth := map[byte]int{}
	closing := map[byte]byte{'}': '{', ']': '['}
	skipGroup := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end := i + 1
			for end < len(expr) && expr[end] != c {
				if expr[end] == '\\' && c != '`' {
					end++
				}
				end++
			}
			if end >= len(expr) {
				return nil, fmt.Errorf("unterminated string at offset %d in %q", i, expr)
			}
			i = end + 1
		case c == '{' || c == '[':
			depth[c]++
			i++
		case c == '}' || c == ']':
			if depth[closing[c]] == 0 {
				return nil, fmt.Errorf("unbalanced %q at offset %d in %q", c, i, expr)
			}
			depth[closing[c]]--
			i++
		case c == '(' && skipGroup:
			end := strings.IndexByte(expr[i:], ')')
			if end < 0 {
				return nil, fmt.Errorf("unterminated grouping list at offset %d in %q", i, expr)
			}
			skipGroup = false
			i += end + 1
		case c >= '0' && c <= '9', c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '$':
			i++
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
		case isIdent(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			if depth['{'] > 0 || depth['['] > 0 {
				continue
			}
			if groupingKeywords[word] {
				skipGroup = true
				continue
			}
			if promqlKeywords[word] {
				continue
			}
			rest := strings.TrimLeft(expr[i:], " \t\n")
			if strings.HasPrefix(rest, "(") {
				continue // a function or aggregation
			}
			names = append(names, word)
		default:
			i++
		}
	}
	if depth['{'] != 0 || depth['['] != 0 {
		return nil, fmt.Errorf("unbalanced brackets in %q", expr)
	}
	return names, nil
}

func isIdent(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y", node=~"$node"}[$__rate_interval])))`: {"a_bucket"},
		`sum by (node, product) (b{state=~"allocated|shared"}) / sum without (le) (c offset 5m)`:         {"b", "c"},
		`x > bool 1e3 and on (node) group_left (product) y{z='}'}`:                                       {"x", "y"},
		`increase(d[1h:5m]) * 100`: {"d"},
	} {
		got, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", expr, err)
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", expr, got, want)
		}
	}
	for _, bad := range []string{`a{b="c"`, `rate(a[5m)`, `a{b="c}`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// queries collects every PromQL expression of a dashboard: the expr of
// every target, nested rows included, and label_values() of variables.
func queries(v any, path string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			p := path + "." + k
			if s, ok := x.(string); ok {
				switch {
				case k == "expr":
					out[p] = s
				case (k == "query" || k == "definition") && strings.HasPrefix(s, "label_values("):
					arg := strings.TrimSuffix(strings.TrimPrefix(s, "label_values("), ")")
					if i := strings.LastIndexByte(arg, ','); i >= 0 {
						arg = arg[:i]
					}
					out[p] = arg
				}
				continue
			}
			queries(x, p, out)
		}
	case []any:
		for i, x := range v {
			queries(x, fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

func TestDashboardQueriesNameRegisteredMetrics(t *testing.T) {
	raw, err := os.ReadFile("gpulink.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("gpulink.json is not JSON: %v", err)
	}
	exprs := map[string]string{}
	queries(dash, "", exprs)
	if len(exprs) < 10 {
		t.Fatalf("found only %d queries in the dashboard", len(exprs))
	}
	known := registeredNames(t)
	used := map[string]bool{}
	for path, expr := range exprs {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: query %q names no metric", path, expr)
		}
		for _, n := range names {
			used[n] = true
			// dcgm-exporter's fields, joined to pods on UUID (join_test.go).
			if strings.HasPrefix(n, "DCGM_FI_") {
				continue
			}
			if !known[n] {
				t.Errorf("%s: query %q uses %s, which neither controller.NewMetrics nor kubeletplugin.NewMetrics registers", path, expr, n)
			}
		}
	}
	t.Logf("%d queries over %d metric names", len(exprs), len(used))
}

// TestPluginQueriesKeyByNode checks that the kubelet plugin's panels name
// nodes by the plugin's node label, never by the scrape's target labels:
// two plugin pods of one node are scraped side by side during a rolling
// update (with a pod network under two addresses), so a query keyed by
// instance or pod would show one node twice or add its two copies. That
// the queries do not double count is checked on a real Prometheus
// (test/e2e/prometheus_test.go).
func TestPluginQueriesKeyByNode(t *testing.T) {
	raw, err := os.ReadFile("gpulink.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	queries(dash, "", exprs)
	target := regexp.MustCompile(`\b(instance|job|pod|container|endpoint|service)\b`)
	checked := 0
	for path, expr := range exprs {
		if !strings.Contains(expr, "gpulink_kubeletplugin_") || strings.HasPrefix(expr, "gpulink_kubeletplugin_prepared_gpu_info") {
			continue // the label_values() of the namespace variable
		}
		checked++
		if !strings.Contains(expr, `node=~"$node"`) {
			t.Errorf("%s: %q does not follow the node variable ($node)", path, expr)
		}
		// The info series' own namespace and pod labels are the
		// workload's, not the target's.
		rest := strings.ReplaceAll(expr, `namespace=~"$namespace"`, "")
		if !strings.Contains(expr, "prepared_gpu_info") {
			if m := target.FindString(rest); m != "" {
				t.Errorf("%s: %q uses the target label %s", path, expr, m)
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked %d plugin queries, want at least 10", checked)
	}
}
