#!/usr/bin/env bash
# Builds and runs gpulink's GPU acceptance suite (internal/gpucheck).
#
#   hack/gpu-check.sh bundle      build _output/gpu-check/ and _output/gpu-check.tar.gz
#   hack/gpu-check.sh run [ARGS]  build the bundle, then run it on this host
#                                 (ARGS go to gpulink-gpucheck, e.g. --dry-run)
#
# The bundle holds bin/gpulink-gpucheck (the suite, stripped, links glibc
# >= 2.34 dynamically for NVML's dlopen), bin/runc (v1.5.1 from
# hack/tools/runc, static, without libseccomp), probe/gpucheck-probe.cu (the
# CUDA program the suite builds with nvcc on the GPU host), gpu-check.sh
# and README.md. The tarball (what is copied) must stay under 60 MiB; the build fails otherwise.
# Copy the tarball to a GPU host, unpack it and run ./gpu-check.sh as root
# (see hack/gpu-check/README.md).
set -euo pipefail
LOG_TAG=gpu-check
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUNDLE="${OUTPUT_DIR}/gpu-check"
TARBALL="${OUTPUT_DIR}/gpu-check.tar.gz"
MAX_MIB=60

build_runc() {
	local out="${BUNDLE}/bin/runc" want
	want="$(awk '$1 == "require" && $2 == "github.com/opencontainers/runc" { print $3 }' "${REPO_ROOT}/hack/tools/runc/go.mod")"
	[[ -n "${want}" ]] || die "hack/tools/runc/go.mod pins no runc version"
	if [[ -x "${out}" ]] && "${out}" --version 2>/dev/null | grep -qx "runc version ${want#v}"; then
		return
	fi
	log "building runc ${want} (static, no seccomp)"
	mkdir -p "$(dirname "${out}")"
	(
		cd "${REPO_ROOT}/hack/tools/runc"
		# cgo for runc's nsenter; static so that the bundle needs no
		# libseccomp or a matching glibc on the GPU host.
		CGO_ENABLED=1 GOFLAGS=-mod=readonly go build -trimpath -tags "netgo osusergo" \
			-ldflags "-s -w -extldflags -static" -o "${out}.tmp" github.com/opencontainers/runc
	)
	mv "${out}.tmp" "${out}"
}

bundle() {
	mkdir -p "${BUNDLE}/bin" "${BUNDLE}/probe"
	log "building gpulink-gpucheck"
	(cd "${REPO_ROOT}" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "${BUNDLE}/bin/gpulink-gpucheck" ./cmd/gpulink-gpucheck)
	build_runc
	log "building nvidia-cdi-hook (the hooks of the base CDI spec)"
	(cd "${REPO_ROOT}" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "${BUNDLE}/bin/nvidia-cdi-hook" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook)
	cp "${REPO_ROOT}/internal/gpucheck/probe/gpucheck-probe.cu" "${BUNDLE}/probe/"
	cp "${REPO_ROOT}/hack/gpu-check/gpu-check.sh" "${REPO_ROOT}/hack/gpu-check/README.md" "${BUNDLE}/"
	chmod +x "${BUNDLE}/gpu-check.sh"
	tar -C "${OUTPUT_DIR}" -czf "${TARBALL}.tmp" gpu-check
	mv "${TARBALL}.tmp" "${TARBALL}"
	local dir_bytes tar_bytes
	dir_bytes="$(du -sb "${BUNDLE}" | cut -f1)"
	tar_bytes="$(stat -c %s "${TARBALL}")"
	log "bundle ${BUNDLE}: $((dir_bytes / 1048576)) MiB ($(du -sh "${BUNDLE}/bin/"* | awk '{printf "%s %s  ", $2, $1}' | sed "s|${BUNDLE}/||g")); ${TARBALL}: $((tar_bytes / 1048576)) MiB"
	# What is copied to a GPU host is the tarball.
	if ((tar_bytes >= MAX_MIB * 1048576)); then
		die "the bundle's tarball is $((tar_bytes / 1048576)) MiB, over the ${MAX_MIB} MiB limit"
	fi
}

case "${1:-}" in
bundle) bundle ;;
run)
	shift
	bundle
	exec "${BUNDLE}/gpu-check.sh" "$@"
	;;
*)
	usage
	exit 2
	;;
esac
