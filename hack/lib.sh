# shellcheck shell=bash
# Shared by the gpulink scripts (hack/*.sh).
# Source it after setting LOG_TAG, the name log lines start with.
#
# Environment: GPULINK_OUTPUT_DIR (default <repo>/_output), GPULINK_BIN_DIR
# (default $GPULINK_OUTPUT_DIR/bin), as for test/localcluster.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTPUT_DIR="${GPULINK_OUTPUT_DIR:-${REPO_ROOT}/_output}"
# shellcheck disable=SC2034 # used by the scripts that source this file
BIN_DIR="${GPULINK_BIN_DIR:-${OUTPUT_DIR}/bin}"

log() { printf '[%s %s] %s\n' "${LOG_TAG}" "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# usage prints the calling script's header comment.
usage() {
	awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
}

# build_go_tool MODULE_DIR OUT LDFLAGS PACKAGE builds PACKAGE of the tools
# module in MODULE_DIR (hack/tools/<name>, a Go module of its own) into OUT.
# -mod=readonly: go.sum in the repository is the source of truth; a missing
# or changed checksum is an error, never silently fixed.
build_go_tool() {
	local dir="$1" out="$2" ldflags="$3" pkg="$4"
	mkdir -p "$(dirname "${out}")"
	(
		cd "${dir}" || exit
		CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "${out}.tmp" -ldflags "-s -w ${ldflags}" "${pkg}"
	)
	mv "${out}.tmp" "${out}"
}
