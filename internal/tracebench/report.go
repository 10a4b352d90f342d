package tracebench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// WriteMarkdown writes, per task list, the unallocated GPU and the
// fragmentation rate per policy at each arrival step from minPercent on,
// the ratio of each gpulink row to FGD, and the multi-GPU tasks' share on
// their ideal link class at the last step.
func WriteMarkdown(w io.Writer, results []*ListResult, minPercent int) error {
	var b strings.Builder
	for _, r := range results {
		steps := r.StepPercents()
		fmt.Fprintf(&b, "### %s (%d nodes, %d GPUs, %d task classes in M, %d seeds)\n\n", r.List, r.Nodes, r.GPUs, r.Classes, len(r.Seeds))
		b.WriteString("GPU requests not allocated, % of GPU capacity (mean ± sd over seeds):\n\n")
		ratios := ratioColumns(r)
		var names []string
		for _, rc := range ratios {
			names = append(names, rc[0]+" / "+rc[1])
		}
		header(&b, "arrived", r.Policies, names...)
		for si, pct := range steps {
			if pct < minPercent {
				continue
			}
			fmt.Fprintf(&b, "| %d %% |", pct)
			for _, p := range r.Policies {
				s := r.Summarize(p, si)
				fmt.Fprintf(&b, " %.2f ± %.2f |", s.Unalloc, s.UnallocSD)
			}
			for _, rc := range ratios {
				fmt.Fprintf(&b, " %s |", ratio(r, rc[0], rc[1], si))
			}
			b.WriteString("\n")
		}
		b.WriteString("\nFragmentation rate (fragmented / unallocated GPU, %):\n\n")
		header(&b, "arrived", r.Policies)
		for si, pct := range steps {
			if pct < minPercent {
				continue
			}
			fmt.Fprintf(&b, "| %d %% |", pct)
			for _, p := range r.Policies {
				fmt.Fprintf(&b, " %.1f |", r.Summarize(p, si).FragRate)
			}
			b.WriteString("\n")
		}
		last := len(steps) - 1
		if last >= 0 {
			fmt.Fprintf(&b, "\nMulti-GPU tasks placed by %d %% arrived (mean per seed) and the share of them on their ideal link class:\n\n", steps[last])
			header(&b, "", r.Policies)
			b.WriteString("| placed |")
			for _, p := range r.Policies {
				fmt.Fprintf(&b, " %.0f |", r.Summarize(p, last).Multi)
			}
			b.WriteString("\n| on ideal class |")
			for _, p := range r.Policies {
				if s := r.Summarize(p, last); math.IsNaN(s.IdealShare) {
					b.WriteString(" – |")
				} else {
					fmt.Fprintf(&b, " %.3f |", s.IdealShare)
				}
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func header(b *strings.Builder, first string, policies []string, last ...string) {
	fmt.Fprintf(b, "| %s |", first)
	for _, p := range append(slices.Clone(policies), last...) {
		fmt.Fprintf(b, " %s |", p)
	}
	b.WriteString("\n|---|")
	for range len(policies) + len(last) {
		b.WriteString("---|")
	}
	b.WriteString("\n")
}

// ratioColumns are the ratios the unallocated-GPU table ends with: the
// chart's defaults (on a running cluster and on a new one) and gpulink
// placing the pods without GPUs too, each against FGD and first fit,
// where both rows were replayed.
func ratioColumns(r *ListResult) [][2]string {
	var out [][2]string
	for _, a := range []string{PolicyGpulink, PolicyGpulinkFresh, PolicyGpulinkCPUPods} {
		for _, b := range []string{PolicyFGD, PolicyFirstFit} {
			if has(r.Policies, a) && has(r.Policies, b) {
				out = append(out, [2]string{a, b})
			}
		}
	}
	return out
}

// ratio is a's mean unallocated GPU over b's at step si ("–" when either
// is missing, "1.00" when both are zero: equally good).
func ratio(r *ListResult, a, b string, si int) string {
	if !has(r.Policies, a) || !has(r.Policies, b) {
		return "–"
	}
	x, y := r.Summarize(a, si).Unalloc, r.Summarize(b, si).Unalloc
	switch {
	case y == 0 && x == 0:
		return "1.00"
	case y == 0:
		return "∞"
	}
	return fmt.Sprintf("%.2f", x/y)
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// svg palette: gpulink and FGD stand out, baselines are muted.
var policyStyle = map[string]string{
	PolicyGpulink:         `stroke="#d62728" stroke-width="2.5"`,
	PolicyGpulinkFresh:    `stroke="#ff7f0e" stroke-width="1.5"`,
	PolicyGpulinkNoScarce: `stroke="#d62728" stroke-width="1" stroke-dasharray="1 3"`,
	PolicyGpulinkNoSteer:  `stroke="#ff9896" stroke-width="1.2"`,
	PolicyGpulinkTaint:    `stroke="#ff9896" stroke-width="1.2" stroke-dasharray="6 3"`,
	PolicyGpulinkMost:     `stroke="#d62728" stroke-width="1.5" stroke-dasharray="6 3"`,
	PolicyGpulinkCPUPods:  `stroke="#d62728" stroke-width="1.5" stroke-dasharray="2 2"`,
	PolicyFGDPaper:        `stroke="#1f77b4" stroke-width="1.2" stroke-dasharray="4 2"`,
	PolicyGpulinkGPUOnly:  `stroke="#d62728" stroke-width="1" stroke-dasharray="8 2 2 2"`,
	PolicyFGD:             `stroke="#1f77b4" stroke-width="2.5"`,
	PolicyBestFit:         `stroke="#2ca02c" stroke-width="1.2"`,
	PolicyDotProduct:      `stroke="#9467bd" stroke-width="1.2"`,
	PolicyPacking:         `stroke="#8c564b" stroke-width="1.2"`,
	PolicyClustering:      `stroke="#e377c2" stroke-width="1.2"`,
	PolicyRandomFit:       `stroke="#7f7f7f" stroke-width="1.2"`,
	PolicyFirstFit:        `stroke="#bcbd22" stroke-width="1.2"`,
}

// WriteSVG draws, per task list, the unallocated GPU and the
// fragmentation rate against arrivals (from minPercent), one line per
// policy: one row of two panels per list.
func WriteSVG(w io.Writer, results []*ListResult, minPercent int) error {
	const pw, ph, ml, mr, mt, mb = 380.0, 220.0, 50.0, 20.0, 30.0, 40.0
	legendH := 50.0
	width := 2*(pw+ml+mr) + 10
	height := float64(len(results))*(ph+mt+mb) + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for ri, r := range results {
		steps := r.StepPercents()
		var xs []int
		var idx []int
		for si, p := range steps {
			if p >= minPercent {
				xs = append(xs, p)
				idx = append(idx, si)
			}
		}
		if len(xs) == 0 {
			continue
		}
		for panel := range 2 {
			x0 := ml + float64(panel)*(pw+ml+mr)
			y0 := mt + float64(ri)*(ph+mt+mb)
			title := "GPU requests not allocated (% of capacity)"
			if panel == 1 {
				title = "fragmentation rate (%)"
			}
			val := func(p string, si int) float64 {
				s := r.Summarize(p, si)
				if panel == 0 {
					return s.Unalloc
				}
				return s.FragRate
			}
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, p := range r.Policies {
				for _, si := range idx {
					v := val(p, si)
					if !math.IsNaN(v) {
						lo, hi = math.Min(lo, v), math.Max(hi, v)
					}
				}
			}
			if math.IsInf(lo, 0) {
				continue
			}
			lo = math.Floor(lo/5) * 5
			hi = math.Ceil(hi/5) * 5
			if hi <= lo {
				hi = lo + 5
			}
			px := func(pct int) float64 {
				if len(xs) == 1 {
					return x0 + pw/2
				}
				return x0 + pw*float64(pct-xs[0])/float64(xs[len(xs)-1]-xs[0])
			}
			py := func(v float64) float64 { return y0 + ph - ph*(v-lo)/(hi-lo) }
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-weight="bold">%s: %s</text>`+"\n", x0, y0-10, r.List, title)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", x0, y0, pw, ph)
			for i := 0; i <= 5; i++ {
				v := lo + (hi-lo)*float64(i)/5
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
					x0, py(v), x0+pw, py(v), x0-4, py(v)+4, v)
			}
			for _, pct := range xs {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d%%</text>`+"\n", px(pct), y0+ph+14, pct)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">arrived GPU requests (%% of capacity)</text>`+"\n", x0+pw/2, y0+ph+30)
			for _, p := range r.Policies {
				var pts []string
				for k, si := range idx {
					if v := val(p, si); !math.IsNaN(v) {
						pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[k]), py(v)))
					}
				}
				style := policyStyle[p]
				if style == "" {
					style = `stroke="#000" stroke-width="1"`
				}
				fmt.Fprintf(&b, `<polyline fill="none" %s points="%s"><title>%s</title></polyline>`+"\n", style, strings.Join(pts, " "), p)
			}
		}
	}
	// Legend along the bottom.
	var pols []string
	if len(results) > 0 {
		pols = results[0].Policies
	}
	ly := height - legendH + 15
	lx := ml
	for _, p := range pols {
		if lx+30+7*float64(len(p)) > width {
			lx, ly = ml, ly+18
		}
		style := policyStyle[p]
		if style == "" {
			style = `stroke="#000" stroke-width="1"`
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" %s/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, ly, lx+20, ly, style, lx+24, ly+4, p)
		lx += 30 + 7*float64(len(p))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
