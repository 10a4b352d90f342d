#!/usr/bin/env bash
# gpulink GPU acceptance suite: run as root on a Linux host with an NVIDIA
# GPU, driver, nvidia-smi and nvcc (no Kubernetes needed). Arguments go to
# bin/gpulink-gpucheck (--help lists them; --dry-run runs the GPU-less
# checks). Exit status: 0 all checks passed, 1 a check failed, 2 the suite
# could not start (no GPU/driver, not root, bad flags).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "$(id -u)" != 0 ]]; then
	echo "gpu-check: must run as root (runc containers, MPS control daemons)" >&2
	exit 2
fi
exec "${here}/bin/gpulink-gpucheck" --runc "${here}/bin/runc" "$@"
