#!/usr/bin/env bash
# gpulink on kind, without GPUs: the kubelet plugin presents the worker as
# an 8 x V100 SXM2 server (NVLink hybrid cube mesh) read from
# topology-v100-sxm2-8.txt, or as a simulated DGX A100 (DISCOVERY=mock).
#
#   demo/kind/run.sh [up]   create the cluster, build and load the image,
#                           install the chart, run the examples
#   demo/kind/run.sh down   delete the cluster
#
# Needs docker, kind (a release that can run Kubernetes 1.37 node images),
# kubectl and Go (to build helm from hack/tools/helm unless HELM is set, and
# the gpulink CLI unless GPULINK is set).
# Settings (environment):
#   CLUSTER_NAME     kind cluster name                  (gpulink)
#   K8S_VERSION      Kubernetes release of the nodes    (v1.37.1)
#   KIND_NODE_IMAGE  node image; built with `kind build node-image` from
#                    the K8S_VERSION release if it cannot be pulled
#                                                       (kindest/node:$K8S_VERSION)
#   IMAGE            gpulink image to build and load    (gpulink.local/gpulink:kind-demo)
#   IMAGE_BUILD      make-image: hack/image.sh (make image; Linux with
#                    apt-get, no Docker needed), docker: the same contents
#                    from deployments/container/Dockerfile
#                                                       (make-image on Debian/Ubuntu, else docker)
#   DISCOVERY        topology-file or mock              (topology-file)
#   HELM, KUBECTL    client binaries                    (_output/bin/helm, kubectl)
#   GPULINK          the gpulink CLI, which shows the published GPUs
#                    (gpulink inspect) and why a pod waits (gpulink
#                    explain)                           (built into _output/bin/gpulink)
#   TIMEOUT          wait per step                      (180s)
set -o errexit -o nounset -o pipefail

DEMO=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "${DEMO}/../.." && pwd)

CLUSTER_NAME=${CLUSTER_NAME:-gpulink}
K8S_VERSION=${K8S_VERSION:-v1.37.1}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:${K8S_VERSION}}
IMAGE=${IMAGE:-gpulink.local/gpulink:kind-demo}
if [[ -z "${IMAGE_BUILD:-}" ]]; then
	IMAGE_BUILD=docker
	[[ "$(uname -s)" == Linux ]] && command -v apt-get >/dev/null && IMAGE_BUILD=make-image
fi
DISCOVERY=${DISCOVERY:-topology-file}
HELM=${HELM:-${ROOT}/_output/bin/helm}
KUBECTL=${KUBECTL:-kubectl}
GPULINK_BUILD=0
if [[ -z "${GPULINK:-}" ]]; then
	GPULINK=${ROOT}/_output/bin/gpulink
	GPULINK_BUILD=1
fi
TIMEOUT=${TIMEOUT:-180s}

SYSTEM_NS=gpulink-system
DEMO_NS=gpulink-demo
TOPOLOGY_CM=gpulink-demo-topology
# Pods of the examples, in the order they are applied: the 4-GPU NVLink
# claim first, while both NVLink quads are still free, the shares last.
EXAMPLES=(
	"1-four-gpus-nvlink.yaml:four-gpus-nvlink"
	"2-two-gpus.yaml:two-gpus"
	"3-one-gpu.yaml:one-gpu"
	"4-shares.yaml:share-a share-b"
)

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'demo/kind/run.sh: %s\n' "$*" >&2; exit 1; }
kc() { "${KUBECTL}" --context "kind-${CLUSTER_NAME}" "$@"; }
# gl COMMAND ARGS... runs a gpulink CLI command against the cluster.
gl() { "${GPULINK}" "$1" --context "kind-${CLUSTER_NAME}" "${@:2}"; }

need() {
	local tool
	for tool in "$@"; do
		command -v "${tool}" >/dev/null || die "${tool} not found on PATH"
	done
}

node_image() {
	if docker image inspect "${KIND_NODE_IMAGE}" >/dev/null 2>&1; then
		return
	fi
	log "pulling ${KIND_NODE_IMAGE}"
	if docker pull "${KIND_NODE_IMAGE}"; then
		return
	fi
	# No published image for this release (yet): build one from the
	# official release binaries.
	log "building ${KIND_NODE_IMAGE} from the ${K8S_VERSION} release"
	kind build node-image --type release "${K8S_VERSION}" --image "${KIND_NODE_IMAGE}"
}

cluster() {
	if kind get clusters 2>/dev/null | grep -qx "${CLUSTER_NAME}"; then
		log "reusing kind cluster ${CLUSTER_NAME}"
		return
	fi
	log "creating kind cluster ${CLUSTER_NAME} (${KIND_NODE_IMAGE})"
	kind create cluster --name "${CLUSTER_NAME}" --image "${KIND_NODE_IMAGE}" \
		--config "${DEMO}/kind-config.yaml" --wait 120s
}

# cli builds the gpulink CLI (unless GPULINK names one): the demo shows
# the GPUs and explains a waiting pod with the project's own commands.
cli() {
	((GPULINK_BUILD)) || return 0
	log "building the gpulink CLI into ${GPULINK}"
	(cd "${ROOT}" && go build -o "${GPULINK}" ./cmd/gpulink)
}

# image builds the gpulink image as an archive and loads it into the nodes
# with `kind load image-archive`: by default the archive `make image` builds
# (hack/image.sh), the image the local e2e test runs; with IMAGE_BUILD=docker
# the Dockerfile's build of the same contents (a static test keeps the two
# in step), saved with `docker save`.
image() {
	local repo=${IMAGE%:*} tag=${IMAGE##*:} archive
	case "${IMAGE_BUILD}" in
	make-image)
		log "building ${IMAGE} with hack/image.sh (make image)"
		archive=$(IMAGE_REPO="${repo}" IMAGE_TAG="${tag}" "${ROOT}/hack/image.sh" | awk '{print $2}')
		;;
	docker)
		log "building ${IMAGE} from deployments/container/Dockerfile"
		docker build -f "${ROOT}/deployments/container/Dockerfile" \
			--build-arg VERSION="${tag}" -t "${IMAGE}" "${ROOT}"
		archive="${ROOT}/_output/image/gpulink-${tag}-docker.tar"
		mkdir -p "$(dirname "${archive}")"
		docker save -o "${archive}" "${IMAGE}"
		;;
	*) die "IMAGE_BUILD must be make-image or docker, not ${IMAGE_BUILD}" ;;
	esac
	[[ -f "${archive}" ]] || die "no image archive built for ${IMAGE}"
	log "loading ${archive} into the cluster's nodes"
	kind load image-archive "${archive}" --name "${CLUSTER_NAME}"
}

install() {
	if [[ ! -x "${HELM}" ]]; then
		"${ROOT}/hack/helm.sh" --build
	fi
	local args=()
	case "${DISCOVERY}" in
	topology-file)
		# Every node running the plugin gets this topology; the demo has
		# one GPU node (the control plane is tainted).
		kc create namespace "${SYSTEM_NS}" --dry-run=client -o yaml | kc apply -f -
		kc -n "${SYSTEM_NS}" create configmap "${TOPOLOGY_CM}" \
			--from-file=topology.txt="${DEMO}/topology-v100-sxm2-8.txt" \
			--dry-run=client -o yaml | kc apply -f -
		args=(--set kubeletPlugin.discovery=topology-file
			--set kubeletPlugin.topologyConfigMap="${TOPOLOGY_CM}"
			--set kubeletPlugin.topologyConfigMapKey=topology.txt
			--set-string kubeletPlugin.gpuProduct="Tesla V100-SXM2-32GB"
			--set-string kubeletPlugin.gpuMemory=32Gi)
		;;
	mock)
		args=(--set kubeletPlugin.discovery=mock --set kubeletPlugin.mockServer=dgxa100)
		;;
	*) die "DISCOVERY must be topology-file or mock, not ${DISCOVERY}" ;;
	esac
	log "installing the gpulink chart (discovery ${DISCOVERY})"
	local repo=${IMAGE%:*} tag=${IMAGE##*:}
	# pullPolicy Never: the image exists only in the nodes (kind load).
	"${HELM}" upgrade --install gpulink "${ROOT}/deployments/helm/gpulink" \
		--kube-context "kind-${CLUSTER_NAME}" --namespace "${SYSTEM_NS}" --create-namespace \
		--set image.repository="${repo}" --set image.tag="${tag}" --set image.pullPolicy=Never \
		"${args[@]}" --wait --timeout "${TIMEOUT}"
}

# wait_for_slices waits until a node publishes gpulink GPUs, which is when
# `gpulink inspect` has a node to show (it prints nothing before), and
# shows them.
wait_for_slices() {
	log "waiting for the kubelet plugin to publish its GPUs"
	local deadline=$((SECONDS + ${TIMEOUT%s})) gpus=""
	until gpus=$(gl inspect 2>/dev/null) && [[ -n "${gpus}" ]]; do
		((SECONDS < deadline)) || {
			gl inspect || true
			kc -n "${SYSTEM_NS}" logs -l app.kubernetes.io/component=kubelet-plugin --tail=50 || true
			die "no node publishes gpulink GPUs after ${TIMEOUT}"
		}
		sleep 2
	done
	printf '%s\n' "${gpus}"
}

# explain prints why a pod is not running (gpulink explain: its claims,
# the controller's decision, its events) and the controller's latest log
# lines, for what no event records (a controller that cannot start).
explain() {
	local pod=$1
	gl explain -n "${DEMO_NS}" "${pod}" || true
	kc -n "${SYSTEM_NS}" logs -l app.kubernetes.io/component=controller --tail=30 || true
}

examples() {
	kc create namespace "${DEMO_NS}" --dry-run=client -o yaml | kc apply -f -
	local entry file pod
	for entry in "${EXAMPLES[@]}"; do
		file=${entry%%:*}
		log "applying examples/${file}"
		kc apply -f "${DEMO}/examples/${file}"
		for pod in ${entry#*:}; do
			if ! kc -n "${DEMO_NS}" wait --for=condition=Ready "pod/${pod}" --timeout="${TIMEOUT}"; then
				explain "${pod}"
				die "pod ${pod} is not running after ${TIMEOUT}"
			fi
		done
	done
}

summary() {
	log "allocations (device per claim; shares carry a shareID)"
	kc -n "${DEMO_NS}" get resourceclaims -o custom-columns='CLAIM:.metadata.name,POD:.status.reservedFor[0].name,DEVICES:.status.allocation.devices.results[*].device,SHARE:.status.allocation.devices.results[*].shareID'
	local pod
	for pod in $(kc -n "${DEMO_NS}" get pods -o name); do
		log "${pod}: environment injected through CDI"
		kc -n "${DEMO_NS}" logs "${pod}" || true
	done
	cat >&2 <<EOF

The demo keeps running. Explore with
  kubectl --context kind-${CLUSTER_NAME} get resourceslices,resourceclaims -A
and remove it with
  ${DEMO}/run.sh down
EOF
}

up() {
	[[ "${TIMEOUT}" =~ ^[0-9]+s$ ]] || die "TIMEOUT must be seconds with an s suffix, e.g. 300s"
	need docker kind "${KUBECTL}"
	[[ "${IMAGE_BUILD}" != make-image ]] || need go apt-get dpkg-deb
	((GPULINK_BUILD == 0)) || need go
	node_image
	cluster
	cli
	image
	install
	wait_for_slices
	examples
	summary
}

down() {
	need kind
	kind delete cluster --name "${CLUSTER_NAME}"
}

case "${1:-up}" in
up) up ;;
down) down ;;
*) die "usage: $0 [up|down]" ;;
esac
