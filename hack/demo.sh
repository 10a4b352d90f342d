#!/usr/bin/env bash
# gpulink on a local Kubernetes 1.37 cluster, no Docker, registry or GPU
# needed (`make demo` runs `hack/demo.sh up`).
#
#   hack/demo.sh [up]     build what is missing (binaries, the gpulink image),
#                         start the local cluster (one real node, two API-only
#                         nodes), install gpulink with `helm install` of the
#                         chart from the locally built image, run the example
#                         workloads of demo/workloads and print what they got
#   hack/demo.sh report   print the table again
#   hack/demo.sh status   show the demo's processes and the cluster
#   hack/demo.sh down     stop the gpulink processes and the cluster
#
# The GPU nodes, each presented by a gpulink-kubeletplugin with
# --discovery=topology-file (demo/topologies):
#   local-node   8 x A40 in NVLink-bridged pairs (pcie-nvbridge-8.txt); a real
#                kubelet + containerd node: pods run and see their GPUs via CDI
#   api-node-1   8 x V100 SXM2, NVLink hybrid cube mesh (v100-sxm2-8-aliyun-sccgn6.txt)
#   api-node-2   7 x P40 on two PCIe switches (p40-pcie-7.txt)
# API-only nodes have no kubelet: pods are allocated and bound there, never run.
# gpulink is installed as a user installs it: `make image` (hack/image.sh)
# builds the image, it is imported into the real node's containerd, and
# `helm install` of deployments/helm/gpulink runs the kubelet plugin as the
# chart's DaemonSet pod on the real node and the controller as the chart's
# Deployment (two replicas, leader election), with the chart's RBAC,
# DeviceClasses and admission policies. The real node's plugin sees a
# stand-in driver install (_output/demo/driver: library and firmware files,
# /dev/nvidia* stand-ins) and writes its base CDI spec with nvcdi from it.
# API-only nodes have no kubelet to run a DaemonSet pod, so their plugins
# run as processes (the DaemonSet's node affinity leaves out nodes labelled
# gpulink.io/local-api-node).
# The workloads carry no gate of their own: the chart's policy adds it.
#
# `up` on a running demo (or a cluster left by `hack/cluster.sh up`) stops it
# and starts afresh. Needs root (containerd and the kubelet of the real node).
# State and logs: _output/demo (gpulink processes: _output/demo/run/NAME.{pid,log}),
# _output/cluster (the cluster, see hack/README.md).
set -euo pipefail

LOG_TAG=demo
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLUSTER_DIR="${OUTPUT_DIR}/cluster"
DEMO_DIR="${OUTPUT_DIR}/demo"
RUN_DIR="${DEMO_DIR}/run"
KUBECONFIG_PATH="${CLUSTER_DIR}/kubeconfig"
RELEASE=gpulink
CHART_NAMESPACE=gpulink-system
IMAGE_TAG=demo
CLUSTER_SH="${REPO_ROOT}/hack/cluster.sh"
CHART="${REPO_ROOT}/deployments/helm/gpulink"
TOPOLOGIES="${REPO_ROOT}/demo/topologies"
WORKLOADS="${REPO_ROOT}/demo/workloads"
NAMESPACE=gpulink-demo
REAL_NODE=local-node
WAIT_TIMEOUT="${DEMO_WAIT_TIMEOUT:-4m}"

# node:topology file:product:memory:compute capability:node label
GPU_NODES=(
	"local-node:pcie-nvbridge-8.txt:NVIDIA A40:48Gi:8.6:a40-nvbridge-8"
	"api-node-1:v100-sxm2-8-aliyun-sccgn6.txt:Tesla V100-SXM2-16GB:16Gi:7.0:v100-sxm2-8"
	"api-node-2:p40-pcie-7.txt:Tesla P40:24Gi:6.1:p40-pcie-7"
)
# Workload files and their pods, applied in this order; each file's pods
# are allocated (and running, on the real node) before the next is applied.
WORKLOAD_FILES=(
	"01-one-gpu.yaml:one-gpu"
	"02-two-gpus.yaml:two-gpus"
	"03-two-gpus-v100.yaml:two-gpus-v100"
	"04-four-gpus-nvlink.yaml:four-gpus-nvlink"
	"05-four-gpus-p40.yaml:four-gpus-p40"
	"06-shares.yaml:share-a,share-b"
)

kc() { "${BIN_DIR}/kubectl" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }
report_bin() { "${BIN_DIR}/demoreport" "$1" -kubeconfig "${KUBECONFIG_PATH}" -namespace "${NAMESPACE}" \
	-run-dir "${RUN_DIR}" -real-node "${REAL_NODE}" -timeout "${WAIT_TIMEOUT}" "${@:2}"; }

all_pods() {
	local entry pods=()
	for entry in "${WORKLOAD_FILES[@]}"; do pods+=("${entry#*:}"); done
	local IFS=,
	echo "${pods[*]}"
}

# proc_pid prints the PID of a demo process if it still runs the gpulink
# binary it was started as.
proc_pid() {
	local name="$1" pid
	[[ -f "${RUN_DIR}/${name}.pid" ]] || return 1
	pid="$(cat "${RUN_DIR}/${name}.pid")"
	[[ "${pid}" =~ ^[0-9]+$ ]] || return 1
	tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q "${BIN_DIR}/gpulink-" || return 1
	echo "${pid}"
}

# start_proc NAME BINARY ARGS... runs a gpulink binary in the background.
start_proc() {
	local name="$1"
	shift
	mkdir -p "${RUN_DIR}"
	setsid "$@" </dev/null >"${RUN_DIR}/${name}.log" 2>&1 &
	echo $! >"${RUN_DIR}/${name}.pid"
	log "started ${name} (pid $!, log ${RUN_DIR#"${REPO_ROOT}"/}/${name}.log)"
}

stop_procs() {
	local f name pid start
	local -A pids=()
	shopt -s nullglob
	for f in "${RUN_DIR}"/*.pid; do
		name="$(basename "${f}" .pid)"
		if pid="$(proc_pid "${name}")"; then
			log "stopping ${name} (pid ${pid})"
			kill -TERM "${pid}" 2>/dev/null || true
			pids[${name}]=${pid}
		fi
		rm -f "${f}"
	done
	shopt -u nullglob
	start=${SECONDS}
	for name in "${!pids[@]}"; do
		pid=${pids[${name}]}
		while kill -0 "${pid}" 2>/dev/null; do
			if ((SECONDS - start > 20)); then
				log "${name} did not stop within 20 s of SIGTERM; killing it"
				kill -KILL "${pid}" 2>/dev/null || true
				break
			fi
			sleep 0.2
		done
	done
}

demo_running() {
	local f
	shopt -s nullglob
	for f in "${RUN_DIR}"/*.pid; do
		if proc_pid "$(basename "${f}" .pid)" >/dev/null; then
			shopt -u nullglob
			return 0
		fi
	done
	shopt -u nullglob
	return 1
}

cmd_down() {
	stop_procs
	"${CLUSTER_SH}" down
	umount_driver_root
	log "demo stopped (logs stay in ${RUN_DIR#"${REPO_ROOT}"/} and ${CLUSTER_DIR#"${REPO_ROOT}"/}/logs)"
}

# mk_driver_root lays out a stand-in driver install under _output/demo/driver,
# the one the e2e tests use (demoreport driver-root): the files nvcdi looks
# for (libcuda, libnvidia-ml, nvidia-smi, firmware) and /dev/nvidia*
# stand-ins for the real node's GPUs (character devices with /dev/null's
# numbers), so that containers of the real node get driver files and device
# nodes through CDI as they would on a GPU machine. The chart mounts the
# driver root with HostToContainer propagation, which needs a shared mount
# (as on systemd hosts and under the GPU Operator's /run/nvidia/driver).
mk_driver_root() {
	local root="${DEMO_DIR}/driver" entry node file=""
	for entry in "${GPU_NODES[@]}"; do
		IFS=: read -r node file _ <<<"${entry}"
		[[ "${node}" == "${REAL_NODE}" ]] && break
	done
	"${BIN_DIR}/demoreport" driver-root -dir "${root}" -gpus "$(grep -c '^GPU[0-9]' "${TOPOLOGIES}/${file}")"
	if ! mountpoint -q "${root}"; then
		mount --bind "${root}" "${root}"
		mount --make-rshared "${root}"
	fi
}

umount_driver_root() {
	local root="${DEMO_DIR}/driver"
	if mountpoint -q "${root}" 2>/dev/null; then
		umount -l "${root}" || true
	fi
}

start_plugins() {
	local entry node file product memory cc label registrar plugin cdi mps
	for entry in "${GPU_NODES[@]}"; do
		IFS=: read -r node file product memory cc label <<<"${entry}"
		kc label node "${node}" --overwrite "demo.gpulink.dev/server=${label}" >/dev/null
		if [[ "${node}" == "${REAL_NODE}" ]]; then
			continue # the chart's DaemonSet pod (install_chart)
		fi
		# No kubelet, so no DaemonSet pod: a plugin process registers with
		# nobody but publishes the node's ResourceSlices all the same.
		log "${node} is an API-only node (no kubelet): its kubelet plugin runs as a process, not as the DaemonSet's pod"
		registrar="${DEMO_DIR}/nodes/${node}/registry"
		plugin="${DEMO_DIR}/nodes/${node}/plugin"
		cdi="${DEMO_DIR}/nodes/${node}/cdi"
		mps="${DEMO_DIR}/nodes/${node}/mps"
		mkdir -p "${registrar}" "${plugin}" "${cdi}" "${mps}"
		start_proc "kubeletplugin-${node}" "${BIN_DIR}/gpulink-kubeletplugin" \
			--node-name="${node}" \
			--kubeconfig="${KUBECONFIG_PATH}" \
			--discovery=topology-file \
			--topology-file="${TOPOLOGIES}/${file}" \
			--gpu-product="${product}" \
			--gpu-memory="${memory}" \
			--gpu-compute-capability="${cc}" \
			--gpu-driver-version=550.90.07 \
			--kubelet-registrar-dir="${registrar}" \
			--kubelet-plugin-dir="${plugin}" \
			--cdi-root="${cdi}" \
			--mps-root="${mps}" \
			--metrics-address= \
			--v=2
	done
	for entry in "${GPU_NODES[@]}"; do
		IFS=: read -r node file _ <<<"${entry}"
		report_bin wait-slices -node "${node}" -devices "$(grep -c '^GPU[0-9]' "${TOPOLOGIES}/${file}")"
	done
}

# install_chart installs gpulink with `helm install` from the image
# hack/image.sh built and imported: the kubelet plugin as the DaemonSet's
# pod on the real node (topology-file discovery from a ConfigMap, the
# stand-in driver root), the controller as the Deployment. The local
# cluster has no pod network or kube-proxy, so the pods use the host
# network and reach the API server at its loopback address (the chart's
# apiServer value); its kubelet root and CDI directory are under
# _output/cluster. Then it waits until the API server applies the
# scheduling-gate policy (demoreport wait-gate).
install_chart() {
	local api host port entry node="" file product memory cc
	api="$(kc config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
	host="${api#https://}"
	port="${host##*:}"
	host="${host%:*}"
	for entry in "${GPU_NODES[@]}"; do
		IFS=: read -r node file product memory cc _ <<<"${entry}"
		[[ "${node}" == "${REAL_NODE}" ]] && break
	done
	kc create namespace "${CHART_NAMESPACE}" >&2
	kc -n "${CHART_NAMESPACE}" create configmap gpulink-topology --from-file=topology.txt="${TOPOLOGIES}/${file}" >&2
	cat >"${DEMO_DIR}/values.yaml" <<VALUES
image:
  repository: gpulink.local/gpulink
  tag: ${IMAGE_TAG}
  pullPolicy: Never
# No kube-proxy: the pods reach the API server on its host address.
apiServer:
  host: "${host}"
  port: ${port}
kubeletPlugin:
  discovery: topology-file
  topologyConfigMap: gpulink-topology
  gpuProduct: ${product}
  gpuMemory: ${memory}
  driverRoot: ${DEMO_DIR}/driver
  kubeletRootDir: ${CLUSTER_DIR}/kubelet
  cdiRoot: ${CLUSTER_DIR}/cdi
  mpsRoot: ${DEMO_DIR}/nodes/${REAL_NODE}/mps
  hostNetwork: true
  metricsPort: 0
  # Every node with a kubelet: API-only nodes cannot run the pod.
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: gpulink.io/local-api-node, operator: DoesNotExist}]
  extraArgs: ["--gpu-compute-capability=${cc}", "--gpu-driver-version=550.90.07", "--v=2"]
controller:
  replicas: 2
  hostNetwork: true
  metricsPort: 0
  healthPort: 0
  nodeSelector: {kubernetes.io/hostname: ${REAL_NODE}}
  extraArgs: ["--v=2"]
# Pods written for device plugins (nvidia.com/gpu: 2) run too. No
# kube-proxy: the API server calls the webhook on the node's address, where
# both replicas serve it.
compat:
  url: https://127.0.0.1:9443/translate-pods
  tls: {ipSANs: [127.0.0.1]}
VALUES
	"${BIN_DIR}/helm" install "${RELEASE}" "${CHART}" --namespace "${CHART_NAMESPACE}" \
		--kubeconfig "${KUBECONFIG_PATH}" --values "${DEMO_DIR}/values.yaml" >&2
	log "waiting for the chart's kubelet plugin and controller pods"
	kc -n "${CHART_NAMESPACE}" rollout status "daemonset/${RELEASE}-kubelet-plugin" --timeout="${WAIT_TIMEOUT}" >&2
	kc -n "${CHART_NAMESPACE}" rollout status "deployment/${RELEASE}-controller" --timeout="${WAIT_TIMEOUT}" >&2
	report_bin wait-gate
}

cmd_up() {
	[[ "$(id -u)" == 0 ]] || die "the demo's real node (containerd, kubelet) needs root"
	local begin=${SECONDS}
	trap 'log "the demo failed; gpulink logs: ${RUN_DIR}/*.log, cluster logs: ${CLUSTER_DIR}/logs; hack/demo.sh down stops what runs"' ERR
	cd "${REPO_ROOT}"
	log "step 1/5: build what is missing"
	log "Kubernetes, etcd and containerd (hack/cluster.sh build; from empty Go caches ~10-13 min on 2 cores, else seconds)"
	"${CLUSTER_SH}" build
	log "gpulink binaries (make build)"
	make --no-print-directory build >&2
	go build -o "${BIN_DIR}/demoreport" ./test/e2e/cmd/demoreport
	log "helm (hack/helm.sh --build)"
	"${REPO_ROOT}/hack/helm.sh" --build
	log "the gpulink image (hack/image.sh: go-containerregistry, no Docker)"
	IMAGE_TAG="${IMAGE_TAG}" "${REPO_ROOT}/hack/image.sh" >"${OUTPUT_DIR}/demo-image.txt"

	log "step 2/5: local cluster"
	if demo_running || "${CLUSTER_SH}" status >/dev/null 2>&1; then
		log "a demo or cluster is already running: stopping it to start afresh"
		cmd_down
	fi
	umount_driver_root
	rm -rf "${DEMO_DIR}"
	"${CLUSTER_SH}" up --real-node --api-nodes 2

	log "step 3/5: install gpulink (helm install of the chart from the local image; plugin processes for the API-only nodes)"
	mkdir -p "${DEMO_DIR}"
	"${CLUSTER_SH}" import-image "$(awk '{print $2}' "${OUTPUT_DIR}/demo-image.txt")"
	mk_driver_root
	install_chart
	start_plugins

	log "step 4/5: example workloads (demo/workloads)"
	kc apply -f "${WORKLOADS}/00-namespace.yaml" >&2
	local entry file pods
	for entry in "${WORKLOAD_FILES[@]}"; do
		file="${entry%%:*}"
		pods="${entry#*:}"
		log "applying demo/workloads/${file}"
		kc apply -f "${WORKLOADS}/${file}" >&2
		report_bin wait -pods "${pods}"
	done

	log "step 5/5: what the pods got ($((SECONDS - begin)) s since the start)"
	cmd_report
	cat <<EOF

Inspect:
  export KUBECONFIG=${KUBECONFIG_PATH}
  PATH=${BIN_DIR}:\$PATH kubectl gpulink inspect       per node: GPUs, holders, free capacity, links
  hack/cluster.sh kubectl get resourceclaims -A -o wide
  hack/cluster.sh kubectl -n ${NAMESPACE} logs share-a    what the container sees (ENV, DEV lines)
  hack/cluster.sh kubectl -n ${NAMESPACE} get events      the controller's decisions
  hack/cluster.sh kubectl -n ${CHART_NAMESPACE} get pods     the chart's plugin DaemonSet pod and controller replicas
  gpulink logs: ${CLUSTER_DIR}/pod-logs (chart pods), ${RUN_DIR}/*.log (API-only nodes' plugins)
  cluster logs: ${CLUSTER_DIR}/logs/*.log

Tear down:
  hack/demo.sh down        stops the gpulink processes and the cluster (hack/cluster.sh down)
EOF
}

cmd_report() {
	[[ -x "${BIN_DIR}/demoreport" ]] || die "no demo has run yet (hack/demo.sh up)"
	"${CLUSTER_SH}" status >/dev/null 2>&1 || die "the cluster is not running (hack/demo.sh up)"
	report_bin report -pods "$(all_pods)" -pod-log-dir "${CLUSTER_DIR}/pod-logs"
}

cmd_status() {
	local f name pid
	shopt -s nullglob
	for f in "${RUN_DIR}"/*.pid; do
		name="$(basename "${f}" .pid)"
		if pid="$(proc_pid "${name}")"; then
			echo "${name}: running (pid ${pid})"
		else
			echo "${name}: not running (log ${RUN_DIR}/${name}.log)"
		fi
	done
	shopt -u nullglob
	"${CLUSTER_SH}" status
}

main() {
	local cmd="${1:-up}"
	[[ $# -gt 0 ]] && shift
	case "${cmd}" in
	up) cmd_up "$@" ;;
	down) cmd_down "$@" ;;
	report) cmd_report "$@" ;;
	status) cmd_status "$@" ;;
	-h | --help | help) usage ;;
	*) die "unknown command ${cmd} (up, report, status, down)" ;;
	esac
}

main "$@"
