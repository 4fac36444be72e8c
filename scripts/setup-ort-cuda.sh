#!/usr/bin/env bash
# Fetches a CUDA build of ONNX Runtime for GPU hosts (run via `make
# setup-cuda`), from two npm packages and without running any install
# script:
#  - onnxruntime-node@1.29.0: its libonnxruntime.so.1, the runtime's core
#    (the same core serves the CPU and loads the CUDA provider from its
#    own folder on demand);
#  - com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9: ONNX Runtime
#    1.29.0's CUDA execution provider built for CUDA 13
#    (libonnxruntime_providers_cuda.so, libonnxruntime_providers_shared.so;
#    MIT, Microsoft's build repackaged).
# Both tarballs and the three libraries are checked against the SHA-256s
# pinned below, and land in .cache/ort/1.29.0-cuda13/, where the prism
# binary looks before the CPU build. The provider needs CUDA 13's
# libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and libcurand.so.10
# on the loader's path (a CUDA 13 toolkit's lib64, or NVIDIA's pip
# wheels), and an NVIDIA driver of the 580 series or later. It ran on an
# H200 (driver 580.159.04, CUDA 13.0): BENCHMARKS.md, "The dense tier on a
# GPU". Idempotent.
set -euo pipefail

CORE_PKG=onnxruntime-node@1.29.0
CORE_TGZ_SHA256=cfdfb45ec4044b1fdca43e5d2e180fb6817e649ff8ad1e0dfc90e18e51b67037
CORE_LIB_SHA256=89688f5cf51c7e31befbb7b9101bc027799009b18d1baa9a5b1146a72e69538d
CUDA_PKG=com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9
CUDA_TGZ_SHA256=2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412
CUDA_LIB_SHA256=56cf3254b118ad837ccc4ed8f6d1b23504bbf7ef91b34cbc0b289cb7f10b3037
SHARED_LIB_SHA256=c6a12593396095f5670160e284c35d1700b7708cf3037b7042e2a5200ccae772
DIR_NAME=1.29.0-cuda13

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/ort/$DIR_NAME"

[ "$(uname -s)/$(uname -m)" = Linux/x86_64 ] || { echo "setup-cuda: the CUDA build is for Linux x86-64 only; this is $(uname -s)/$(uname -m)" >&2; exit 1; }

check() { # FILE SHA256
	local got
	got=$(sha256sum "$1" | cut -d' ' -f1)
	[ "$got" = "$2" ] || { echo "setup-cuda: checksum mismatch for $(basename "$1"): got $got, want $2" >&2; return 1; }
}

if [ -f "$cache/libonnxruntime.so" ] && check "$cache/libonnxruntime.so" "$CORE_LIB_SHA256" 2>/dev/null &&
	check "$cache/libonnxruntime_providers_cuda.so" "$CUDA_LIB_SHA256" 2>/dev/null &&
	check "$cache/libonnxruntime_providers_shared.so" "$SHARED_LIB_SHA256" 2>/dev/null; then
	echo "setup-cuda: ONNX Runtime 1.29.0 with CUDA already in $cache"
	exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "setup-cuda: npm is needed (Debian: apt-get install -y npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch() { # PKG TGZ_SHA256 -> prints the tarball's path
	echo "setup-cuda: fetching $1 from the npm registry (install scripts are not run)" >&2
	(cd "$tmp" && npm pack --silent "$1" >"$tmp/name" 2>"$tmp/npm.err") || { cat "$tmp/npm.err" >&2; echo "setup-cuda: npm pack $1 failed (see above)" >&2; exit 1; }
	local tgz="$tmp/$(tail -1 "$tmp/name")"
	check "$tgz" "$2"
	echo "$tgz"
}
core=$(fetch "$CORE_PKG" "$CORE_TGZ_SHA256")
tar -xzf "$core" -C "$tmp" package/bin/napi-v6/linux/x64/libonnxruntime.so.1
rm -f "$core"
check "$tmp/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" "$CORE_LIB_SHA256"
cuda=$(fetch "$CUDA_PKG" "$CUDA_TGZ_SHA256")
tar -xzf "$cuda" -C "$tmp" package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so package/Plugins/Linux/x64/libonnxruntime_providers_shared.so
rm -f "$cuda"
check "$tmp/package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so" "$CUDA_LIB_SHA256"
check "$tmp/package/Plugins/Linux/x64/libonnxruntime_providers_shared.so" "$SHARED_LIB_SHA256"

mkdir -p "$cache"
mv "$tmp/package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so" "$tmp/package/Plugins/Linux/x64/libonnxruntime_providers_shared.so" "$cache/"
mv "$tmp/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" "$cache/libonnxruntime.so.tmp"
mv "$cache/libonnxruntime.so.tmp" "$cache/libonnxruntime.so"
echo "setup-cuda: ONNX Runtime 1.29.0 with the CUDA 13 execution provider installed in $cache"
echo "setup-cuda: the prism binary now loads it (ORT_LIB overrides); the dense tier needs CUDA 13's libcudart, libcublas, libcublasLt and libcurand on the loader's path, e.g. LD_LIBRARY_PATH=/usr/local/cuda/lib64"
missing=""
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
	ldconfig -p 2>/dev/null | grep -q "$l" || { ldp=${LD_LIBRARY_PATH:-}; for d in ${ldp//:/ }; do [ -e "$d/$l" ] && continue 2; done; missing="$missing $l"; }
done
[ -z "$missing" ] || echo "setup-cuda: not on the loader's path here:$missing (the dense tier will say so and serve on the CPU until they are)"
