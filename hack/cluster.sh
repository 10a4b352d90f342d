#!/usr/bin/env bash
# Local Kubernetes 1.37 cluster for gpulink tests and `make demo`.
#
#   hack/cluster.sh build                      build etcd, Kubernetes, containerd into _output/bin
#   hack/cluster.sh up [--real-node] [--api-nodes N] [--node-name NAME] [--feature-gates A=true,...]
#                                              start a cluster with state under _output/cluster
#                                              (runs test/localcluster/cmd/localcluster in the background;
#                                              the Workload API is served and GenericWorkload,
#                                              DRAWorkloadResourceClaims, TopologyAwareWorkloadScheduling,
#                                              WorkloadWithJob
#                                              are on unless --feature-gates turns them off)
#   hack/cluster.sh down                       stop what `up` started (logs stay in _output/cluster/logs)
#   hack/cluster.sh status                     print whether the cluster runs (exit 3 if not), and its nodes
#   hack/cluster.sh kubeconfig                 print the path of the cluster's kubeconfig
#   hack/cluster.sh kubectl ARGS...            run kubectl against the cluster
#   hack/cluster.sh import-image TAR...        import image archives into the real node's containerd
#
# Environment: GPULINK_OUTPUT_DIR (default <repo>/_output), GPULINK_BIN_DIR
# (default $GPULINK_OUTPUT_DIR/bin).
set -euo pipefail

LOG_TAG=cluster.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLUSTER_DIR="${OUTPUT_DIR}/cluster"
PID_FILE="${OUTPUT_DIR}/cluster.pid"
DAEMON_LOG="${OUTPUT_DIR}/cluster.log"
TOOLS_DIR="${REPO_ROOT}/hack/tools"

# Pinned versions; they must match hack/tools/{k8s,containerd,etcd}/go.mod.
# Each group is built from its own tools module because their dependency
# graphs conflict (see hack/tools/k8s/tools.go).
K8S_VERSION="v1.37.1"
K8S_COMMIT="f78e722310e50bcaca9276be22276d9e91d91308"
K8S_BUILD_DATE="2026-09-23T17:06:22Z"

K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
CONTAINERD_BINARIES=(containerd containerd-shim-runc-v2 ctr)
DEBIAN_PACKAGES=(runc containernetworking-plugins iproute2 util-linux mount procps)

as_root() {
	if [[ "$(id -u)" == 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root to run: $*"
	fi
}

# install_debian_packages installs the Debian packages the cluster needs at run
# time (runc, CNI plugins, ip, mount tools) when any of them is missing.
install_debian_packages() {
	local missing=() p
	for p in "${DEBIAN_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("${p}")
		fi
	done
	if ((${#missing[@]} == 0)); then
		log "Debian packages present: ${DEBIAN_PACKAGES[*]}"
		return
	fi
	log "installing Debian packages: ${missing[*]}"
	local aptlog="${OUTPUT_DIR}/apt-get.log"
	mkdir -p "${OUTPUT_DIR}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"${aptlog}" 2>&1 ||
		{ tail -20 "${aptlog}" >&2; die "apt-get update failed (log: ${aptlog})"; }
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"${aptlog}" 2>&1 ||
		{ tail -20 "${aptlog}" >&2; die "apt-get install ${missing[*]} failed (log: ${aptlog})"; }
	log "installed ${missing[*]}"
}

# build_key identifies a build: the pinned module graph, the Go toolchain and
# the flags. A binary is rebuilt when its stamp does not hold this key.
build_key() {
	local group="$1"
	{
		cat "${TOOLS_DIR}/${group}/go.mod" "${TOOLS_DIR}/${group}/go.sum"
		go env GOVERSION GOOS GOARCH
		echo "${group}" "${K8S_VERSION}" "${K8S_COMMIT}" "${K8S_BUILD_DATE}"
		declare -f build_group
	} | sha256sum | cut -d' ' -f1
}

stamp_ok() {
	local bin="$1" key="$2"
	[[ -x "${BIN_DIR}/${bin}" && -f "${BIN_DIR}/.stamps/${bin}" && "$(cat "${BIN_DIR}/.stamps/${bin}")" == "${key}" ]]
}

# build_group builds the named binaries of one group into BIN_DIR.
build_group() {
	local group="$1"
	shift
	local -a pkgs=() flags=(-trimpath)
	local ldflags='-s -w' tags='' b
	case "${group}" in
	k8s)
		for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/${b}"); done
		ldflags+=" -X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
		ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
		ldflags+=" -X k8s.io/component-base/version.gitCommit=${K8S_COMMIT}"
		ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
		ldflags+=" -X k8s.io/component-base/version.buildDate=${K8S_BUILD_DATE}"
		;;
	containerd)
		for b in "$@"; do pkgs+=("github.com/containerd/containerd/v2/cmd/${b}"); done
		tags='no_btrfs no_devmapper no_zfs'
		;;
	etcd)
		pkgs=(go.etcd.io/etcd/server/v3)
		;;
	*) die "unknown build group ${group}" ;;
	esac
	local tmp
	tmp="$(mktemp -d "${BIN_DIR}/.build.XXXXXX")"
	(
		cd "${TOOLS_DIR}/${group}"
		if [[ "${group}" == etcd ]]; then
			CGO_ENABLED=0 go build "${flags[@]}" -ldflags "${ldflags}" -o "${tmp}/etcd" "${pkgs[@]}"
		else
			CGO_ENABLED=0 go build "${flags[@]}" -tags "${tags}" -ldflags "${ldflags}" -o "${tmp}/" "${pkgs[@]}"
		fi
	) || { rm -rf "${tmp}"; die "building ${group} binaries ($*) failed"; }
	for b in "$@"; do
		mv -f "${tmp}/${b}" "${BIN_DIR}/${b}"
	done
	rm -rf "${tmp}"
}

cmd_build() {
	command -v go >/dev/null || die "go is not installed"
	install_debian_packages
	mkdir -p "${BIN_DIR}/.stamps"
	local group key b start
	local -A members=(
		[etcd]="etcd"
		[k8s]="${K8S_BINARIES[*]}"
		[containerd]="${CONTAINERD_BINARIES[*]}"
	)
	for group in etcd containerd k8s; do
		key="$(build_key "${group}")"
		local -a todo=()
		for b in ${members[${group}]}; do
			stamp_ok "${b}" "${key}" || todo+=("${b}")
		done
		if ((${#todo[@]} == 0)); then
			log "${group}: up to date (${members[${group}]})"
			continue
		fi
		if [[ "${group}" == k8s ]]; then
			log "${group}: building ${todo[*]} (from empty Go caches this takes ~10 min on 2 cores)"
		else
			log "${group}: building ${todo[*]}"
		fi
		start=${SECONDS}
		build_group "${group}" "${todo[@]}"
		for b in "${todo[@]}"; do
			echo "${key}" >"${BIN_DIR}/.stamps/${b}"
		done
		log "${group}: built ${todo[*]} in $((SECONDS - start)) s"
	done
	log "binaries in ${BIN_DIR}"
}

# daemon_pid prints the PID of the running localcluster daemon, if any.
daemon_pid() {
	[[ -f "${PID_FILE}" ]] || return 1
	local pid
	pid="$(cat "${PID_FILE}")"
	[[ "${pid}" =~ ^[0-9]+$ ]] || return 1
	# Only our daemon: the PID must still run localcluster on our state dir.
	tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q -- "-dir ${CLUSTER_DIR}" || return 1
	echo "${pid}"
}

cmd_up() {
	local -a args=()
	while (($# > 0)); do
		case "$1" in
		--real-node) args+=(-real-node) ;;
		--api-nodes)
			[[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--api-nodes needs a number"
			args+=(-api-nodes "$2")
			shift
			;;
		--api-nodes=*)
			[[ "${1#*=}" =~ ^[0-9]+$ ]] || die "--api-nodes needs a number"
			args+=(-api-nodes "${1#*=}")
			;;
		--node-name)
			[[ $# -ge 2 ]] || die "--node-name needs a value"
			args+=(-node-name "$2")
			shift
			;;
		--feature-gates)
			[[ $# -ge 2 ]] || die "--feature-gates needs a value"
			args+=(-feature-gates "$2")
			shift
			;;
		*) die "up: unknown flag $1" ;;
		esac
		shift
	done
	if pid="$(daemon_pid)"; then
		die "a cluster is already running (pid ${pid}); run '$0 down' first"
	fi
	local b
	for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd containerd-shim-runc-v2 ctr; do
		[[ -x "${BIN_DIR}/${b}" ]] || die "${BIN_DIR}/${b} missing; run '$0 build' first"
	done
	log "building the localcluster command"
	(cd "${REPO_ROOT}" && go build -o "${BIN_DIR}/localcluster" ./test/localcluster/cmd/localcluster) ||
		die "building test/localcluster/cmd/localcluster failed"
	mkdir -p "${OUTPUT_DIR}"
	local ready="${OUTPUT_DIR}/cluster.ready"
	rm -f "${ready}"
	log "starting cluster in ${CLUSTER_DIR} (log: ${DAEMON_LOG})"
	local start=${SECONDS}
	(
		cd "${REPO_ROOT}"
		GPULINK_BIN_DIR="${BIN_DIR}" exec setsid "${BIN_DIR}/localcluster" -dir "${CLUSTER_DIR}" \
			-ready-file "${ready}" "${args[@]}" </dev/null >"${DAEMON_LOG}" 2>&1
	) &
	local pid=$!
	echo "${pid}" >"${PID_FILE}"
	local last=${SECONDS}
	while [[ ! -f "${ready}" ]]; do
		if ! kill -0 "${pid}" 2>/dev/null; then
			rm -f "${PID_FILE}"
			tail -n 40 "${DAEMON_LOG}" >&2 || true
			die "the cluster failed to start (full log: ${DAEMON_LOG})"
		fi
		if ((SECONDS - start > 600)); then
			kill -TERM "${pid}" 2>/dev/null || true
			die "the cluster was not ready after 600 s (log: ${DAEMON_LOG})"
		fi
		if ((SECONDS - last >= 5)); then
			last=${SECONDS}
			log "waiting for the cluster ($((SECONDS - start)) s): $(tail -n 1 "${DAEMON_LOG}" 2>/dev/null | cut -c1-120)"
		fi
		sleep 0.5
	done
	log "cluster up in $((SECONDS - start)) s (pid ${pid})"
	log "export KUBECONFIG=${CLUSTER_DIR}/kubeconfig; kubectl is ${BIN_DIR}/kubectl"
}

cmd_down() {
	local pid
	if ! pid="$(daemon_pid)"; then
		rm -f "${PID_FILE}"
		if [[ -f "${CLUSTER_DIR}/state.json" && -x "${BIN_DIR}/localcluster" ]]; then
			log "no cluster daemon running; cleaning up leftovers in ${CLUSTER_DIR}"
			"${BIN_DIR}/localcluster" -cleanup -dir "${CLUSTER_DIR}"
		else
			log "no cluster running"
		fi
		return
	fi
	log "stopping cluster (pid ${pid})"
	local start=${SECONDS}
	kill -TERM "${pid}"
	while kill -0 "${pid}" 2>/dev/null; do
		if ((SECONDS - start > 120)); then
			die "the cluster daemon (pid ${pid}) did not stop within 120 s (log: ${DAEMON_LOG})"
		fi
		sleep 0.2
	done
	rm -f "${PID_FILE}"
	if grep -q 'error:' <(tail -n 5 "${DAEMON_LOG}"); then
		tail -n 20 "${DAEMON_LOG}" >&2
		die "the cluster stopped with errors (log: ${DAEMON_LOG})"
	fi
	log "cluster stopped in $((SECONDS - start)) s"
}

cmd_status() {
	local pid
	if ! pid="$(daemon_pid)"; then
		echo "cluster: not running"
		return 3
	fi
	echo "cluster: running (pid ${pid}, state ${CLUSTER_DIR})"
	echo "kubeconfig: ${CLUSTER_DIR}/kubeconfig"
	if [[ -f "${CLUSTER_DIR}/kubeconfig" ]]; then
		"${BIN_DIR}/kubectl" --kubeconfig "${CLUSTER_DIR}/kubeconfig" get nodes -o wide
	fi
}

cmd_kubeconfig() {
	daemon_pid >/dev/null || die "no cluster running; run '$0 up' first"
	echo "${CLUSTER_DIR}/kubeconfig"
}

cmd_kubectl() {
	daemon_pid >/dev/null || die "no cluster running; run '$0 up' first"
	exec "${BIN_DIR}/kubectl" --kubeconfig "${CLUSTER_DIR}/kubeconfig" "$@"
}

cmd_import_image() {
	(($# > 0)) || die "import-image needs one or more image tars (docker-archive or OCI)"
	daemon_pid >/dev/null || die "no cluster running; run '$0 up --real-node' first"
	local sock="${CLUSTER_DIR}/containerd/containerd.sock" tar
	[[ -S "${sock}" ]] || die "the cluster has no real node (no ${sock}); run '$0 up --real-node'"
	for tar in "$@"; do
		log "importing ${tar}"
		"${BIN_DIR}/ctr" --address "${sock}" --namespace k8s.io images import "${tar}" 2> >(grep -v 'DEPRECATION' >&2)
	done
}

main() {
	local cmd="${1:-}"
	[[ $# -gt 0 ]] && shift
	case "${cmd}" in
	build) cmd_build "$@" ;;
	up) cmd_up "$@" ;;
	down) cmd_down "$@" ;;
	status) cmd_status "$@" ;;
	kubeconfig) cmd_kubeconfig "$@" ;;
	kubectl) cmd_kubectl "$@" ;;
	import-image) cmd_import_image "$@" ;;
	-h | --help | help | '') usage ;;
	*) usage; die "unknown command ${cmd}" ;;
	esac
}

main "$@"
