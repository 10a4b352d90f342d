# gpulink — build, test and demo entry points.
#
#   make demo   build what is missing, start a local Kubernetes 1.37 cluster,
#               install gpulink and run example workloads
#   make test   everything CI runs: static checks, unit tests (race detector),
#               Helm chart lint, integration and end-to-end tests on a real
#               local control plane
#
# Everything a target needs is built or installed by the project's own
# scripts under hack/: a fresh machine needs only Go, make and apt-get.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
OUTPUT    := $(CURDIR)/_output
BIN       := $(OUTPUT)/bin
GOFLAGS_BUILD := -trimpath
BINARIES  := gpulink gpulink-kubeletplugin gpulink-controller
IMAGE_TAG ?= dev
# Packages whose tests need a running control plane carry a build tag and
# live under test/; everything else is a unit test.
INTEGRATION_PKGS := ./test/...

export GPULINK_BIN_DIR := $(BIN)

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: build
build: ## build the gpulink binaries into _output/bin
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))
	@ln -sf gpulink $(BIN)/kubectl-gpulink
	# The CDI hooks of the base spec run nvidia-cdi-hook; the plugin installs
	# it on the node (see kubeletplugin/cdihook.go). cgo: it links libc.
	CGO_ENABLED=1 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/nvidia-cdi-hook github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook

.PHONY: image
image: ## container image without Docker: _output/image/gpulink-$(IMAGE_TAG).tar, tagged gpulink.local/gpulink:$(IMAGE_TAG) (IMAGE_TAG=dev)
	IMAGE_TAG=$(IMAGE_TAG) hack/image.sh

.PHONY: test
test: verify lint test-unit gpu-check-bundle cluster-build helm-lint test-integration test-prometheus ## run every check CI runs (the chart's policies are checked on a live API server by test-integration's test/integration/chartpolicies; the GPU suite's bundle is built and size-checked, its dry run runs with the bundle's runc; the Grafana dashboard on a real Prometheus)

.PHONY: verify
verify: ## gofmt, go vet, go.mod tidiness
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^hack/tools/')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags integration,e2e,prometheus ./test/...
	@unformatted=$$(gofmt -l hack/tools/image); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	cd hack/tools/image && $(GO) vet ./...

.PHONY: lint
lint: ## golangci-lint (built from hack/tools/lint), test code included
	hack/lint.sh

.PHONY: test-unit
test-unit: ## unit tests with the race detector (and of the image builder, hack/tools/image, its own module); the churn goal's optimum and bound on 16 and 32 GPUs without it (about 90 s, 1 GiB)
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -run 'Test(ChurnLeadOverMyopic|RelaxedBoundAboveOptimum)/(pcie-16|nvlink-tiered-32|synthetic-32)$$' ./driver/allocate/
	cd hack/tools/image && $(GO) test -race -count=1 ./...

.PHONY: cluster-build
cluster-build: ## build etcd, Kubernetes 1.37 components and containerd into _output/bin
	hack/cluster.sh build

.PHONY: test-integration
test-integration: cluster-build build helm kueue ## integration and e2e tests on a real local control plane (the e2e test renders the chart with helm; the Kueue e2e test runs _output/bin/kueue)
	$(GO) test -count=1 -p 1 -timeout 40m -tags integration,e2e $(INTEGRATION_PKGS)
	# The gangs and Jobs once more on a cluster without the Workload API: through
	# gpulink's labels instead of PodGroups.
	GPULINK_WORKLOAD_GATES=off $(GO) test -count=1 -p 1 -timeout 10m -tags integration,e2e -run 'Gang|Job' ./test/integration/controller/
	GPULINK_WORKLOAD_GATES=off $(GO) test -count=1 -p 1 -timeout 10m -tags integration,e2e -run 'TestJob' ./test/e2e/

.PHONY: helm
helm: ## build _output/bin/helm (from hack/tools/helm) if missing or outdated
	hack/helm.sh --build

.PHONY: kueue
kueue: ## build _output/bin/kueue (Kueue v0.17's manager, from hack/tools/kueue) if missing or outdated, for test/e2e/kueue_*_test.go
	hack/kueue.sh

.PHONY: prometheus
prometheus: ## build _output/bin/prometheus (Prometheus 3.16, from hack/tools/prometheus) if missing or outdated
	hack/prometheus.sh

# Part of make test since 2026-11-29: outside it, the test went two days
# broken unnoticed. A cold build of Prometheus takes 4.5 to 5 min on 2
# cores, the test about 1.5 more (docs/metrics.md, "Checked against a real
# Prometheus").
.PHONY: test-prometheus
test-prometheus: cluster-build build helm prometheus ## the chart's ServiceMonitor and every query of the Grafana dashboard on a real Prometheus scraping the chart-installed controller and plugin on a local cluster
	$(GO) test -count=1 -v -timeout 30m -tags e2e,prometheus -run '^TestPrometheusDashboard$$' ./test/e2e/

.PHONY: helm-lint
helm-lint: ## helm lint and helm template of the chart
	hack/helm.sh

.PHONY: bench
bench: ## allocator (latency p50/p99, churn quality per topology vs baselines), gang placement and the controller's gang decisions (64 pods × 8 GPUs on 5,000 nodes, GPU+NIC gangs, a gang's further pod), a GPU+NIC pod's decision with one worker and the default (and its retry while it waits), and kubelet plugin benchmarks
	$(GO) test -run '^$$' -bench . -benchmem ./driver/... ./kubeletplugin/...
	$(GO) test -run '^$$' -bench 'GangDecision$$|GangDecisionRails|GangReplacementDecision|AlignedPodNearWaiting' -benchtime 50x ./controller/
	$(GO) test -run '^$$' -bench 'WaitingGPUsWithNICs|DecideGPUsWithNICs' -benchtime 50x ./controller/planner/

# FGD's production trace (USENIX ATC '23), read from TRACE_DIR at run time
# (never copied into the project): gpulink against FGD and the paper's
# baselines, tables and chart into docs/performance/ (trace.md explains).
TRACE_DIR   ?= ../shared/traces/openb
TRACE_SEEDS ?= 10
# The three published lists and lists with GPU-model constraints made from
# them at run time (internal/tracebench/gpuspec.go): the artifact's four
# shares of default drawn by supply, its third drawn uniformly over models,
# and two probes of the recipe on other draws (a fifth of default drawn
# uniformly; a third of multigpu50 drawn uniformly, the hardest known:
# docs/performance/trace.md).
TRACE_LISTS ?= default,multigpu50,gpushare100,default-spec10,default-spec20,default-spec25,default-spec33,default-spec33u,default-spec20u,multigpu50-spec33u
.PHONY: bench-trace
bench-trace: ## replay FGD's trace (TRACE_DIR, TRACE_SEEDS): unallocated GPUs and fragmentation per policy
	@test -d "$(TRACE_DIR)" || { echo "bench-trace: no trace at $(TRACE_DIR) (set TRACE_DIR; see docs/performance/trace.md)"; exit 1; }
	@mkdir -p docs/performance
	$(GO) run ./cmd/gpulink simulate --trace "$(TRACE_DIR)" --seeds $(TRACE_SEEDS) --lists $(TRACE_LISTS) \
		--markdown docs/performance/trace-results.md --svg docs/performance/trace.svg

# FGD's published lists with GPU-model constraints (alibaba/clusterdata,
# cluster-trace-gpu-v2023/csv/openb_pod_list_gpuspecNN.csv: 5, 10, 20, 25
# and 33 % of the GPU tasks pinned), saved by the user into GPUSPEC_DIR
# beside the node list: in neither the project nor the shared copy. The
# goal's three rows, tables into _output/trace-gpuspec.md.
GPUSPEC_DIR   ?= $(TRACE_DIR)
GPUSPEC_LISTS ?= gpuspec05,gpuspec10,gpuspec20,gpuspec25,gpuspec33
.PHONY: bench-trace-gpuspec
bench-trace-gpuspec: ## replay FGD's published lists with GPU-model constraints from GPUSPEC_DIR (TRACE_SEEDS): the chart's defaults against FGD and first fit
	@for f in openb_node_list_gpu_node $$(echo "$(GPUSPEC_LISTS)" | tr , ' ' | sed 's/[^ ]*/openb_pod_list_&/g'); do \
		test -f "$(GPUSPEC_DIR)/$$f.csv" || { echo "bench-trace-gpuspec: $(GPUSPEC_DIR)/$$f.csv is missing: save alibaba/clusterdata's cluster-trace-gpu-v2023/csv/$$f.csv there (docs/performance/trace.md)"; exit 1; }; done
	@mkdir -p $(OUTPUT)
	$(GO) run ./cmd/gpulink simulate --trace "$(GPUSPEC_DIR)" --seeds $(TRACE_SEEDS) --lists $(GPUSPEC_LISTS) \
		--policies gpulink,fgd,first-fit --markdown $(OUTPUT)/trace-gpuspec.md

# Gang placement (issue 31): multi-node jobs (Kalos's jobs, a draw from
# the spot trace's published sizes, and both mixed) replayed on SuperPOD-
# and NVL72-style clusters of 2,048 8-GPU nodes, gpulink against per-pod
# greedy, Kueue TAS, Volcano HyperNode tiers and random, and gpulink with
# the controller's starvation reservation (gpulink:starvationBound). Reads
# GANG_TRACE_DIR at run time (never copied into the project); the tables
# go to docs/performance/gangs-results.md (gangs.md explains them).
GANG_TRACE_DIR ?= ../shared/traces/gangs
GANG_SEEDS     ?= 3
GANG_LOADS     ?= 1,2,3
GANG_WORKLOADS ?= kalos,spot,mixed
.PHONY: bench-gangs
bench-gangs: ## replay multi-node jobs (GANG_TRACE_DIR, GANG_SEEDS, GANG_LOADS, GANG_WORKLOADS): gangs placed, on their minimal level, GPUs held idle, waits, utilisation per policy
	@test -d "$(GANG_TRACE_DIR)" || { echo "bench-gangs: no trace at $(GANG_TRACE_DIR) (set GANG_TRACE_DIR; see docs/performance/gangs.md)"; exit 1; }
	@mkdir -p docs/performance
	$(GO) run ./cmd/gpulink simulate --gang-trace "$(GANG_TRACE_DIR)" --gang-seeds $(GANG_SEEDS) --gang-loads $(GANG_LOADS) --gang-workloads $(GANG_WORKLOADS) \
		--gang-markdown docs/performance/gangs-results.md

# The full scale test; `make test` runs TestScale at its quick default size
# (200 nodes, 400 pods) with the other integration tests. Profiling the
# controller: GPULINK_SCALE_PROFILE=<absolute file> runs it with
# --profiling and writes a CPU profile of GPULINK_SCALE_PROFILE_SECONDS (20)
# from the first wave to <file> and a heap profile at the end of the waves
# to <file>.heap (both reach the test from the environment or make's
# command line), e.g.
#   make scale GPULINK_SCALE_PROFILE=$PWD/_output/scale-cpu.pprof && go tool pprof -top _output/scale-cpu.pprof
SCALE_NODES ?= 5000
SCALE_PODS  ?= 10000
SCALE_WAVES ?= 10

.PHONY: scale
scale: cluster-build helm ## scale test: SCALE_NODES API-only 8-GPU nodes (5000), SCALE_PODS pods (10000) in SCALE_WAVES waves (10) through the controller process; report in _output/scale-report.json
	@mkdir -p $(OUTPUT)
	GPULINK_SCALE_NODES=$(SCALE_NODES) GPULINK_SCALE_PODS=$(SCALE_PODS) GPULINK_SCALE_WAVES=$(SCALE_WAVES) \
	  GPULINK_SCALE_REPORT=$(OUTPUT)/scale-report.json \
	  $(GO) test -count=1 -v -timeout 120m -tags integration -run '^TestScale$$' ./test/scale/

# FGD's trace through the real controller (issue 32, part 3): every
# REPLAY_STRIDE-th openb node as an API-only node, one seed of REPLAY_LIST,
# each task created in the replay's order; the cluster's unallocated GPU at
# each 10 % step against `gpulink simulate --trace` (docs/performance/trace.md).
REPLAY_STRIDE ?= 8
REPLAY_SEED   ?= 1
REPLAY_LIST   ?= default
.PHONY: replay-controller
replay-controller: cluster-build ## FGD's trace replayed through gpulink-controller on a reduced openb cluster vs the simulator (TRACE_DIR, REPLAY_STRIDE, REPLAY_SEED, REPLAY_LIST); report in _output/replay-report.json
	@test -d "$(TRACE_DIR)" || { echo "replay-controller: no trace at $(TRACE_DIR) (set TRACE_DIR)"; exit 1; }
	@mkdir -p $(OUTPUT)
	GPULINK_REPLAY=1 GPULINK_REPLAY_TRACE=$(abspath $(TRACE_DIR)) GPULINK_REPLAY_STRIDE=$(REPLAY_STRIDE) GPULINK_REPLAY_SEED=$(REPLAY_SEED) \
	  GPULINK_REPLAY_LIST=$(REPLAY_LIST) GPULINK_REPLAY_REPORT=$(OUTPUT)/replay-report.json \
	  $(GO) test -count=1 -v -timeout 90m -tags integration -run '^TestReplayController$$' ./test/scale/

# gpulink against the stock kube-scheduler on the same cluster, in one run
# (docs/performance/scheduler.md): pods/s to bound and create→bound
# latency, a burst and one pod at a time, the cluster half full first.
SCHED_NODES ?= 500
.PHONY: bench-scheduler
bench-scheduler: cluster-build helm ## gpulink vs stock kube-scheduler, pods/s and create→bound (SCHED_NODES 8-GPU API-only nodes, 500); report in _output/scheduler-report.json
	@mkdir -p $(OUTPUT)
	GPULINK_SCHED_BENCH=1 GPULINK_SCHED_NODES=$(SCHED_NODES) GPULINK_SCHED_REPORT=$(OUTPUT)/scheduler-report.json \
	  $(GO) test -count=1 -v -timeout 60m -tags integration -run '^TestSchedulerSideBySide$$' ./test/scale/

.PHONY: bench-cpu-pods
bench-cpu-pods: cluster-build helm ## pods without GPU claims: gate.cpuPods (controller places them) vs kube-scheduler alone, pods/s and create→bound (SCHED_NODES); report in _output/cpu-pods-report.json
	@mkdir -p $(OUTPUT)
	GPULINK_SCHED_BENCH=1 GPULINK_SCHED_NODES=$(SCHED_NODES) GPULINK_SCHED_REPORT=$(OUTPUT)/cpu-pods-report.json \
	  $(GO) test -count=1 -v -timeout 60m -tags integration -run '^TestCPUPodsSideBySide$$' ./test/scale/

.PHONY: bench-running
bench-running: cluster-build build helm ## gpulink vs stock kube-scheduler, create→Running on the real node (root); report in _output/running-report.json
	@mkdir -p $(OUTPUT)
	GPULINK_RUNNING_BENCH=1 GPULINK_RUNNING_REPORT=$(OUTPUT)/running-report.json \
	  $(GO) test -count=1 -v -timeout 20m -tags e2e -run '^TestRunningSideBySide$$' ./test/e2e/

.PHONY: demo
demo: ## local cluster + gpulink + example workloads, then a report (hack/demo.sh)
	hack/demo.sh up

.PHONY: demo-down
demo-down: ## stop the demo's gpulink processes and its cluster
	hack/demo.sh down

.PHONY: simulate
simulate: build ## what-if simulation of the shipped example scenario, no cluster
	$(BIN)/gpulink simulate --scenario demo/scenarios/example.yaml

.PHONY: gpu-check-bundle
gpu-check-bundle: ## GPU acceptance suite bundle to copy to a GPU host: _output/gpu-check/ and _output/gpu-check.tar.gz (< 60 MiB)
	hack/gpu-check.sh bundle

.PHONY: gpu-check
gpu-check: ## build the bundle and run the GPU acceptance suite on this host (needs an NVIDIA GPU; GPU_CHECK_ARGS=--dry-run runs the GPU-less checks)
	hack/gpu-check.sh run $(GPU_CHECK_ARGS)

.PHONY: cluster-up
cluster-up: cluster-build ## start a local cluster (kubeconfig in _output/cluster/kubeconfig)
	hack/cluster.sh up --real-node

.PHONY: cluster-down
cluster-down: ## stop the local cluster
	hack/cluster.sh down

.PHONY: clean
clean: ## remove build outputs (keeps the Go caches)
	-hack/cluster.sh down 2>/dev/null
	rm -rf $(OUTPUT)
