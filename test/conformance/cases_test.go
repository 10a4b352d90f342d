//go:build e2e

package conformance_test

import (
	"context"
	"strings"
	"testing"
)

// peerCase runs one or more peer files together and checks what the
// peer-specs README says they expect.
type peerCase struct {
	files []string
	opts  portOptions
	// skipKinds are kinds not applied, with why (a peer's own DeviceClass).
	skipKinds map[string]string
	// applyLater are files the check applies itself (in a later step).
	applyLater map[string]bool
	// gpus is the most GPUs the case holds at once, whole or shared, so
	// that a batch of cases fits the real node's 8.
	gpus int
	// alone runs the case in a batch of its own (it reads which GPUs are
	// free, or needs them all).
	alone bool
	// before runs ahead of applying the files (a rule that must exist
	// before the pods).
	before func(ctx context.Context, t *testing.T, r *run)
	// expectRefusal: the API server refusing an object is the expectation.
	expectRefusal bool
	// defect names a known gpulink defect the case documents ("issue 18
	// defect N", or one this suite found): the check asserts what happens
	// now, so the row is reported without failing the run, and it fails
	// once the defect is fixed, to be turned into a pass.
	defect string
	// na, when set, makes a passing check a "not applicable" row: the
	// check asserts what gpulink does instead of the peer's feature.
	na string
	// note says what was ported and what was checked, for the table.
	note  string
	check func(ctx context.Context, t *testing.T, r *run) string
}

// namespace is the namespace for the case's documents that name none.
func (c *peerCase) namespace() string {
	base := strings.TrimSuffix(strings.TrimSuffix(c.files[0], ".tmpl"), ".yaml")
	base = strings.NewReplacer("/", "-", "_", "-", ".", "-").Replace(strings.ToLower(base))
	if len(base) > 55 {
		base = base[len(base)-55:]
	}
	return "c-" + strings.Trim(base, "-")
}

// row is one peer file's entry in the table: the case that runs it, or
// why it does not apply to gpulink.
type row struct {
	c  *peerCase
	na string
}

// peerRows is the decision for every file of ../shared/peer-specs.
func peerRows() map[string]row {
	rows := map[string]row{}
	runs := func(c *peerCase) {
		for _, f := range c.files {
			rows[f] = row{c: c}
		}
	}
	na := func(reason string, files ...string) {
		for _, f := range files {
			rows[f] = row{na: reason}
		}
	}
	for _, c := range nvidiaCases() {
		runs(c)
	}
	for _, c := range exampleDriverCases() {
		runs(c)
	}
	for _, c := range hamiCases() {
		runs(c)
	}
	for _, c := range taintCases() {
		runs(c)
	}
	for _, c := range kubernetesCases() {
		runs(c)
	}
	notApplicable(na)
	return rows
}

// Common port options.
var (
	dropNVIDIAConfig = map[string]bool{"gpu.nvidia.com": true}
	exitAfterPrint   = portOptions{exitAfterPrint: true}
)

// distinctCase: each of n pods gets k GPUs of its own.
func distinctCase(file string, n, k int, note string) *peerCase {
	return &peerCase{files: []string{file}, gpus: n * k, note: note,
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), n)
			eachSees(t, file, pods, k)
			distinctPods(t, file, pods)
			for _, p := range pods {
				noMPS(t, file, p)
			}
			return ""
		}}
}

// sharedCase: every container of n pods sees the same one GPU.
func sharedCase(file string, n int, note string) *peerCase {
	return &peerCase{files: []string{file}, gpus: 1, note: note,
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), n)
			eachSees(t, file, pods, 1)
			sameGPUs(t, file, pods)
			return ""
		}}
}

// sharesOneGPU: n pods' shares land on one GPU, each with MPS limits.
func sharesOneGPU(file string, n int, opts portOptions, cores string, memMiB int, note string) *peerCase {
	return &peerCase{files: []string{file}, gpus: 1, opts: opts, note: note,
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), n)
			eachSees(t, file, pods, 1)
			sameGPUs(t, file, pods)
			for _, p := range pods {
				for ctr := range p.logs {
					if cores != "" {
						mpsLimits(t, file, p, ctr, cores, memMiB)
					}
				}
			}
			return ""
		}}
}

// nsOf is the namespace of the case's pods: the one its first file
// creates, else the case's own.
func (r *run) nsOf() string {
	for ns := range r.namespaces {
		if ns != r.ns {
			return ns
		}
	}
	return r.ns
}
