#!/usr/bin/env bash
# Builds the gpulink container image without a Docker engine or a registry
# (make image): all binaries of deployments/container/Dockerfile plus glibc
# and CA certificates from the build host's Debian release, packed by
# hack/tools/image (go-containerregistry) into a docker-archive tar.
#
#   hack/image.sh            build _output/image/gpulink-$IMAGE_TAG.tar
#   hack/image.sh --import   build, then import it into the local cluster's
#                            containerd (hack/cluster.sh import-image)
#
# Environment: IMAGE_REPO (gpulink.local/gpulink), IMAGE_TAG (dev),
# SOURCE_DATE_EPOCH (0: timestamps of files and image). Prints the image
# reference, archive path and size. The Debian packages (libc6,
# ca-certificates) are downloaded once with apt-get into
# _output/image/cache and reused; delete that directory to refresh them.
set -o errexit -o nounset -o pipefail

LOG_TAG=image.sh
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
IMAGE_REPO=${IMAGE_REPO:-gpulink.local/gpulink}
IMAGE_TAG=${IMAGE_TAG:-dev}
IMAGE_DIR="${OUTPUT_DIR}/image"
CACHE="${IMAGE_DIR}/cache"
TOOL="${BIN_DIR}/gpulink-image-builder"
PACKAGES=(libc6 ca-certificates)

# fetch_debs downloads the packages unless the cache has them. libc6 is
# pinned to the version installed on the build host when the archive still
# serves it: the cgo binaries are linked against that glibc. Otherwise the
# release's current version is taken; the builder checks that it defines
# every symbol version the binaries need.
fetch_debs() {
	local pkg missing=() want
	mkdir -p "${CACHE}/debs"
	for pkg in "${PACKAGES[@]}"; do
		compgen -G "${CACHE}/debs/${pkg}_*.deb" >/dev/null || missing+=("${pkg}")
	done
	((${#missing[@]} == 0)) && return 0
	command -v apt-get >/dev/null || die "apt-get not found: the image takes glibc and CA certificates from Debian packages"
	log "downloading ${missing[*]} (apt-get update, apt-get download)"
	apt-get update -qq >&2 || die "apt-get update failed"
	# As root, apt drops to the _apt user, which cannot write the cache
	# under _output; download as root instead of warning about it.
	local sandbox=()
	((EUID != 0)) || sandbox=(-o APT::Sandbox::User=root)
	for pkg in "${missing[@]}"; do
		want=${pkg}
		if [[ "${pkg}" == libc6 ]]; then
			want="libc6=$(dpkg-query -W -f '${Version}' libc6 2>/dev/null || true)"
			[[ "${want}" != "libc6=" ]] || want=libc6
		fi
		(cd "${CACHE}/debs" && { apt-get download -q "${sandbox[@]}" "${want}" >&2 || { [[ "${want}" != "${pkg}" ]] && log "${want} no longer served, taking the current ${pkg}" && apt-get download -q "${sandbox[@]}" "${pkg}" >&2; }; }) ||
			die "apt-get download ${pkg} failed"
	done
}

# unpack extracts each package into $CACHE/root/<package> once per .deb.
unpack() {
	local pkg deb dir
	for pkg in "${PACKAGES[@]}"; do
		deb=$(compgen -G "${CACHE}/debs/${pkg}_*.deb" | sort | tail -n 1)
		dir="${CACHE}/root/${pkg}"
		if [[ -f "${dir}.stamp" && "$(cat "${dir}.stamp")" == "$(basename "${deb}")" ]]; then
			continue
		fi
		rm -rf "${dir}" "${dir}.stamp"
		mkdir -p "${dir}"
		dpkg-deb -x "${deb}" "${dir}" || die "unpacking ${deb}"
		basename "${deb}" >"${dir}.stamp"
	done
}

main() {
	local import=false start=${SECONDS}
	case "${1:-}" in
	--import) import=true ;;
	'') ;;
	-h | --help) usage; exit 0 ;;
	*) usage; die "unknown argument $1" ;;
	esac
	local ref="${IMAGE_REPO}:${IMAGE_TAG}" out="${IMAGE_DIR}/gpulink-${IMAGE_TAG}.tar"
	fetch_debs
	unpack
	build_go_tool "${REPO_ROOT}/hack/tools/image" "${TOOL}" "" .
	log "building ${ref}"
	"${TOOL}" --repo "${REPO_ROOT}" --libc-root "${CACHE}/root/libc6" --ca-root "${CACHE}/root/ca-certificates" \
		--out "${out}" --ref "${ref}" --version "${IMAGE_TAG}" --source-date-epoch "${SOURCE_DATE_EPOCH:-0}"
	log "built ${ref} in $((SECONDS - start))s: ${out} ($(du -m "${out}" | cut -f1) MiB)"
	if ${import}; then
		"${REPO_ROOT}/hack/cluster.sh" import-image "${out}"
	fi
	echo "${ref} ${out}"
}

main "$@"
