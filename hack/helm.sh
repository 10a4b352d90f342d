#!/usr/bin/env bash
# Lints and renders the gpulink Helm chart (make helm-lint; part of make test).
#
#   hack/helm.sh               build $GPULINK_BIN_DIR/helm (default _output/bin) if needed, lint, render
#   hack/helm.sh --build       only build it
#   hack/helm.sh --render DIR  the same as without arguments, leaving the renderings in DIR
#
# Helm is built from source (hack/tools/helm, a Go module of its own pinned by
# go.sum) because only the Go module proxy is reachable from CI; no prebuilt
# binaries are downloaded. The binary is rebuilt when its stamped version no
# longer matches hack/tools/helm/go.mod.
#
# Every rendering is checked by helm itself (templates, values.schema.json,
# and a YAML parse of each document) and for apiVersion/kind. The checks
# that need a live API server (a server-side dry run of every rendering,
# CEL compilation included, and the admission policies and RBAC tested for
# real) are the integration test test/integration/chartpolicies (make
# test-integration), which reads this script's renderings through
# --render, so that the list of renderings lives here only.
set -o errexit -o nounset -o pipefail

LOG_TAG=helm.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HELM="${BIN_DIR}/helm"
TOOLS="${REPO_ROOT}/hack/tools/helm"
CHART="${REPO_ROOT}/deployments/helm/gpulink"
# The Kubernetes release the chart targets; helm template reports it as
# .Capabilities.KubeVersion so kubeVersion in Chart.yaml is checked too.
KUBE_VERSION=v1.37.0

build_helm() {
	local want k8s major minor have=""
	want=$(cd "${TOOLS}" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
	if [[ -x "${HELM}" ]]; then
		have=$("${HELM}" version --template '{{.Version}}' 2>/dev/null || true)
	fi
	if [[ "${have}" == "${want}" ]]; then
		return 0
	fi
	# Helm's lint deprecation rules and the default .Capabilities.KubeVersion
	# come from link-time variables; derive them from the client-go Helm is
	# built with (v0.X.Y -> 1.X), as Helm's own Makefile does.
	k8s=$(cd "${TOOLS}" && go list -m -f '{{.Version}}' k8s.io/client-go)
	k8s=${k8s#v}
	major=$(( ${k8s%%.*} + 1 ))
	minor=${k8s#*.}
	minor=${minor%%.*}
	log "building helm ${want} (Kubernetes ${major}.${minor} libraries) into ${HELM}"
	build_go_tool "${TOOLS}" "${HELM}" "-X helm.sh/helm/v3/internal/version.version=${want} \
		-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
		-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${major} \
		-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor} \
		-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${major} \
		-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor}" \
		helm.sh/helm/v3/cmd/helm
}

# check_yaml fails unless the rendering has documents and each carries a
# top-level apiVersion and kind. helm template has already parsed every
# document as YAML; this catches documents that lost their identity (a
# template whose header ended up inside a conditional, say).
check_yaml() {
	local file=$1 docs
	docs=$(awk '/^---/{n++} END{print n+0}' "${file}")
	[[ "${docs}" -gt 0 ]] || die "rendering produced no documents"
	# Every document must name apiVersion and kind at top level.
	awk -v f="${file}" '
		function flush() {
			if (body && (!api || !kind)) { printf "%s: document %d has no apiVersion/kind\n", f, doc > "/dev/stderr"; bad=1 }
			api=0; kind=0; body=0
		}
		/^---/ { flush(); doc++; next }
		/^apiVersion: [^ ]/ { api=1 }
		/^kind: [^ ]/ { kind=1 }
		/^[^#[:space:]]/ { body=1 }
		END { flush(); exit bad }
	' "${file}"
}

render() {
	local name=$1; shift
	local out="${WORK}/${name}.yaml"
	log "helm template (${name}) $*"
	"${HELM}" template gpulink "${CHART}" --namespace gpulink-system \
		--kube-version "${KUBE_VERSION}" "$@" >"${out}"
	check_yaml "${out}"
}

lint() {
	local name=$1; shift
	log "helm lint --strict (${name}) $*"
	"${HELM}" lint --strict --kube-version "${KUBE_VERSION}" "${CHART}" "$@"
}

# expect_failure WHAT PATTERN ARGS... checks that the chart refuses bad
# values (through values.schema.json or a template check) with an error
# matching PATTERN, so an unrelated breakage cannot pass for a rejection.
expect_failure() {
	local what=$1 pattern=$2 out
	shift 2
	if out=$("${HELM}" template gpulink "${CHART}" --kube-version "${KUBE_VERSION}" "$@" 2>&1); then
		die "the chart accepted ${what} ($*)"
	fi
	grep -qE -- "${pattern}" <<<"${out}" || die "${what}: want an error matching '${pattern}', got: ${out}"
	log "rejected as expected: ${what}"
}

build_helm
case "${1:-}" in
--build) exit 0 ;;
--render)
	[[ -n "${2:-}" ]] || die "--render needs a directory"
	mkdir -p "$2"
	WORK=$(cd "$2" && pwd)
	;;
"")
	WORK=$(mktemp -d)
	trap 'rm -rf "${WORK}"' EXIT
	;;
*) die "unknown argument $1 (want --build or --render DIR)" ;;
esac

# The values demo/kind/run.sh installs with.
KIND_DEMO=(--set image.repository=gpulink.local/gpulink --set image.tag=kind-demo --set image.pullPolicy=Never
	--set kubeletPlugin.discovery=topology-file --set kubeletPlugin.topologyConfigMap=gpulink-demo-topology
	--set kubeletPlugin.topologyConfigMapKey=topology.txt
	--set-string kubeletPlugin.gpuProduct="Tesla V100-SXM2-32GB" --set-string kubeletPlugin.gpuMemory=32Gi)

lint defaults
lint kind-demo "${KIND_DEMO[@]}"
render defaults
render kind-demo "${KIND_DEMO[@]}"
render kind-demo-mock --set kubeletPlugin.discovery=mock --set kubeletPlugin.mockServer=dgxa100
render ha --set controller.replicas=2 --set controller.metricsService.enabled=true \
	--set kubeletPlugin.metricsPort=8080
render mock-standalone --set kubeletPlugin.discovery=mock --set kubeletPlugin.managedByController=false \
	--set controller.enabled=false --set gate.enabled=false --set nodeAdmission.enabled=false
# The local cluster's installs (make demo, the e2e test): host network, the
# API server on loopback, no nodes without a kubelet for the plugin.
render local-cluster --set kubeletPlugin.hostNetwork=true --set controller.hostNetwork=true \
	--set apiServer.host=127.0.0.1 --set apiServer.port=6443 --set controller.replicas=2 \
	--set controller.metricsPort=0 --set controller.healthPort=0
[[ $(grep -A1 'name: KUBERNETES_SERVICE_HOST' "${WORK}/local-cluster.yaml" | grep -c 'value: "127.0.0.1"') == 2 ]] ||
	die "apiServer.host is not in the environment of both the plugin and the controller"
# Rolling updates overlap the plugin pods with hostNetwork too: maxSurge
# stays, and the plugin pod declares no (host) port, which would keep the
# surge pod off the node. Readiness is the registration, checked in the pod.
plugin_ds() { awk '/^kind: DaemonSet/,/^---/' "${WORK}/$1.yaml"; }
ds_local=$(plugin_ds local-cluster)
grep -q 'maxSurge: 1' <<<"${ds_local}" &&
	! grep -qE 'containerPort|hostPort' <<<"${ds_local}" &&
	grep -q -- '"--check-ready", "--ready-file=/tmp/registered"' <<<"${ds_local}" &&
	grep -q -- '- --ready-file=/tmp/registered' <<<"${ds_local}" &&
	grep -q 'containerPort: 8082' <<<"$(plugin_ds defaults)" ||
	die "the plugin DaemonSet with hostNetwork does not keep maxSurge 1 without host ports and the registration readiness probe"
render gated-namespaces --set-string 'gate.namespaceSelector.matchLabels.gpulink\.dev/gated=true' \
	--set kubeletPlugin.driverRoot=/run/nvidia/driver
# Pods without GPUs (gate.cpuPods, off by default): the second gate policy
# and the controller's flag come together, and the controller is needed.
render cpu-pods --set gate.cpuPods.enabled=true
grep -q -- '- --place-cpu-pods$' "${WORK}/cpu-pods.yaml" && grep -q 'name: gpulink-cpu-pods-gate$' "${WORK}/cpu-pods.yaml" ||
	die "gate.cpuPods.enabled=true does not render the cpu-pods gate policy and --place-cpu-pods"
if grep -qE -- '--place-cpu-pods|cpu-pods-gate' "${WORK}/defaults.yaml"; then
	die "the default values render the cpu-pods gate or --place-cpu-pods"
fi
expect_failure "gate.cpuPods without the controller" "gate.cpuPods.enabled=true needs controller.enabled=true" \
	--set gate.cpuPods.enabled=true --set controller.enabled=false --set gate.enabled=false --set kubeletPlugin.managedByController=false
# GPU health: NoExecute and custom XID lists reach the plugin's flags, the
# liveness probe goes with the health checks.
render health-noexecute --set kubeletPlugin.health.taintEffect=NoExecute \
	--set-json 'kubeletPlugin.health.fatalXIDs=[48,79]' --set-json 'kubeletPlugin.health.ignoredXIDs=[]'
grep -q -- '--health-taint-effect=NoExecute' "${WORK}/health-noexecute.yaml" &&
	grep -q -- '--health-fatal-xids=48,79' "${WORK}/health-noexecute.yaml" &&
	grep -q 'path: /healthz' "${WORK}/health-noexecute.yaml" ||
	die "kubeletPlugin.health values do not reach the plugin's flags and liveness probe"
render health-off --set kubeletPlugin.health.enabled=false
# The controller's probe stays; the plugin's goes.
[[ $(grep -c 'path: /healthz' "${WORK}/health-off.yaml") -lt $(grep -c 'path: /healthz' "${WORK}/defaults.yaml") ]] &&
	grep -q -- '--health=false' "${WORK}/health-off.yaml" ||
	die "kubeletPlugin.health.enabled=false does not turn off the plugin's health checks and liveness probe"
# Profiling and the recent size mix reach the binaries' flags when set, and
# only then: empty sizeMix values leave the controller's defaults.
render profiling-size-mix --set controller.profiling=true --set kubeletPlugin.profiling=true \
	--set controller.sizeMix.window=256 --set controller.sizeMix.refresh=32
[[ $(grep -c -- '- --profiling=true$' "${WORK}/profiling-size-mix.yaml") == 2 ]] &&
	grep -q -- '- --size-mix-window=256$' "${WORK}/profiling-size-mix.yaml" &&
	grep -q -- '- --size-mix-refresh=32$' "${WORK}/profiling-size-mix.yaml" ||
	die "controller.profiling, kubeletPlugin.profiling and controller.sizeMix do not reach the flags"
render size-mix-off --set controller.sizeMix.window=-1
grep -q -- '- --size-mix-window=-1$' "${WORK}/size-mix-off.yaml" &&
	! grep -q -- '--size-mix-refresh' "${WORK}/size-mix-off.yaml" ||
	die "controller.sizeMix.window=-1 alone does not render just --size-mix-window=-1"
if grep -qE -- '--profiling|--size-mix-' "${WORK}/defaults.yaml"; then
	die "the default values render --profiling or --size-mix-* flags"
fi
# A change of the translated families rolls the controller (it reads them
# at start), and nothing else changes the checksum.
render aliyun-on --set compat.families.aliyun.enabled=true
checksum() { grep -m1 'checksum/compat-config:' "${WORK}/$1.yaml" | awk '{print $2}'; }
[[ -n "$(checksum defaults)" && "$(checksum defaults)" != "$(checksum aliyun-on)" &&
	"$(checksum defaults)" == "$(checksum size-mix-off)" ]] ||
	die "checksum/compat-config does not follow compat.families alone: defaults $(checksum defaults), aliyun on $(checksum aliyun-on), size-mix-off $(checksum size-mix-off)"

# The ServiceMonitor needs the Prometheus Operator's CRDs, which the API
# server of test/integration/chartpolicies lacks: rendered into a
# subdirectory it does not read, and checked here (and against the CRD by
# test/integration/monitoring).
mkdir -p "${WORK}/crd"
render crd/service-monitor --set serviceMonitor.enabled=true --set-string serviceMonitor.labels.release=prom
grep -q '^kind: ServiceMonitor' "${WORK}/crd/service-monitor.yaml" || die "serviceMonitor.enabled=true rendered no ServiceMonitor"
[[ $(grep -c '^  name: gpulink-.*-metrics$' "${WORK}/crd/service-monitor.yaml") == 2 ]] ||
	die "serviceMonitor.enabled=true did not render the controller and plugin metrics Services"
if grep -q 'monitoring.coreos.com' "${WORK}/defaults.yaml"; then
	die "the default values render a ServiceMonitor"
fi
render plugin-metrics-service --set kubeletPlugin.metricsService.enabled=true
grep -q 'clusterIP: None' "${WORK}/plugin-metrics-service.yaml" || die "kubeletPlugin.metricsService.enabled=true rendered no headless Service"
expect_failure "a ServiceMonitor with nothing serving metrics" "nothing serves metrics" \
	--set serviceMonitor.enabled=true --set controller.metricsPort=0 --set kubeletPlugin.metricsPort=0
expect_failure "a malformed scrape interval" "/serviceMonitor/interval" --set serviceMonitor.interval=often

# The controller's NetworkPolicy (off by default): the webhook and metrics
# ports only, and refused where it would do nothing (host network).
render network-policy --set controller.networkPolicy.enabled=true \
	--set-json 'controller.networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]'
grep -q '^kind: NetworkPolicy' "${WORK}/network-policy.yaml" || die "controller.networkPolicy.enabled=true rendered no NetworkPolicy"
if grep -q '^kind: NetworkPolicy' "${WORK}/defaults.yaml"; then
	die "the default values render a NetworkPolicy"
fi
expect_failure "a NetworkPolicy for host-network controller pods" "no effect with controller.hostNetwork=true" \
	--set controller.networkPolicy.enabled=true --set controller.hostNetwork=true
expect_failure "a NetworkPolicy admitting no webhook caller" "/controller/networkPolicy/webhookCIDRs" \
	--set controller.networkPolicy.enabled=true --set-json 'controller.networkPolicy.webhookCIDRs=[]'

expect_failure "controller profiling without a metrics port" "controller.profiling=true needs controller.metricsPort" \
	--set controller.profiling=true --set controller.metricsPort=0
expect_failure "plugin profiling without a metrics port" "kubeletPlugin.profiling=true needs kubeletPlugin.metricsPort" \
	--set kubeletPlugin.profiling=true --set kubeletPlugin.metricsPort=0
expect_failure "a negative size-mix refresh" "/controller/sizeMix/refresh" --set controller.sizeMix.refresh=-1
expect_failure "a size-mix window that is not a number" "/controller/sizeMix/window" --set controller.sizeMix.window=big
expect_failure "an unknown sizeMix key" "additional properties 'windw'" --set controller.sizeMix.windw=5
expect_failure "an unknown discovery mode" "/kubeletPlugin/discovery" --set kubeletPlugin.discovery=bogus
expect_failure "an unknown top-level key" "additional properties 'bogus'" --set bogus=1
expect_failure "a misspelt nested key" "additional properties 'replica'" --set controller.replica=2
expect_failure "zero controller replicas" "/controller/replicas" --set controller.replicas=0
expect_failure "a relative host path" "/kubeletPlugin/cdiRoot" --set kubeletPlugin.cdiRoot=run/cdi
expect_failure "topology-file discovery without a ConfigMap" "needs kubeletPlugin.topologyConfigMap" \
	--set kubeletPlugin.discovery=topology-file
expect_failure "the gate without the controller" "gate.enabled=true needs controller.enabled=true" \
	--set controller.enabled=false
expect_failure "tainted devices without the controller" "managedByController=true needs controller.enabled=true" \
	--set controller.enabled=false --set gate.enabled=false
expect_failure "the gate without the device taint" "needs kubeletPlugin.managedByController=true" \
	--set kubeletPlugin.managedByController=false
expect_failure "an API server host without a port" "apiServer.host .* and apiServer.port .* go together" \
	--set apiServer.host=127.0.0.1
expect_failure "an unknown health taint effect" "/kubeletPlugin/health/taintEffect" --set kubeletPlugin.health.taintEffect=PreferNoSchedule
expect_failure "a fatal XID that is not a number" "/kubeletPlugin/health/fatalXIDs" --set-json 'kubeletPlugin.health.fatalXIDs=["x"]'
expect_failure "an API server port out of range" "/apiServer/port" --set apiServer.host=127.0.0.1 --set apiServer.port=70000
log "chart OK"
