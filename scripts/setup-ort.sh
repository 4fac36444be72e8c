#!/usr/bin/env bash
# Fetches the ONNX Runtime shared library (CPU build) from the npm package
# onnxruntime-node without running its install scripts: `npm pack` downloads
# the tarball, we check its checksum, and tar extracts only the library.
# Idempotent: a verified library already in the cache is left alone.
set -euo pipefail

ORT_NPM_VERSION=1.30.0
# sha256 of the npm tarball and of the extracted library, recorded when the pin was set.
ORT_TGZ_SHA256=6e3390d6b783e7be946fad629292799da28d0b42f84856e50d2c1b0383291e75
ORT_LIB_SHA256=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/ort/$ORT_NPM_VERSION"
lib="$cache/libonnxruntime.so"

if [ -n "${ORT_LIB:-}" ]; then
	if [ -f "$ORT_LIB" ]; then
		echo "setup: using ORT_LIB=$ORT_LIB"
		exit 0
	fi
	echo "setup: ORT_LIB=$ORT_LIB does not exist; unset it or point it at libonnxruntime.so" >&2
	exit 1
fi

case "$(uname -s)/$(uname -m)" in
Linux/x86_64) arch=x64 ;;
Linux/aarch64) arch=arm64 ;;
*) echo "setup: no prebuilt ONNX Runtime for $(uname -s)/$(uname -m); install ONNX Runtime and set ORT_LIB=/path/libonnxruntime.so" >&2; exit 1 ;;
esac

if [ -f "$lib" ] && [ "$arch" != x64 -o "$(sha256sum "$lib" | cut -d' ' -f1)" = "$ORT_LIB_SHA256" ]; then
	echo "setup: ONNX Runtime $ORT_NPM_VERSION already in $lib"
	exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
	echo "setup: npm is needed to fetch ONNX Runtime: install it (Debian: apt-get install -y npm), or set ORT_LIB=/path/libonnxruntime.so" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: fetching onnxruntime-node@$ORT_NPM_VERSION from the npm registry (about 110 MB, install scripts are not run)"
(cd "$tmp" && npm pack --silent "onnxruntime-node@$ORT_NPM_VERSION" >/dev/null 2>"$tmp/npm.err") || {
	cat "$tmp/npm.err" >&2
	echo "setup: npm pack onnxruntime-node@$ORT_NPM_VERSION failed (see above)" >&2
	exit 1
}
tgz="$tmp/onnxruntime-node-$ORT_NPM_VERSION.tgz"
got=$(sha256sum "$tgz" | cut -d' ' -f1)
if [ "$got" != "$ORT_TGZ_SHA256" ]; then
	echo "setup: checksum mismatch for $(basename "$tgz"): got $got, want $ORT_TGZ_SHA256" >&2
	exit 1
fi
member="package/bin/napi-v6/linux/$arch/libonnxruntime.so.1"
tar -xzf "$tgz" -C "$tmp" "$member"
if [ "$arch" = x64 ]; then
	got=$(sha256sum "$tmp/$member" | cut -d' ' -f1)
	if [ "$got" != "$ORT_LIB_SHA256" ]; then
		echo "setup: checksum mismatch for libonnxruntime.so.1: got $got, want $ORT_LIB_SHA256" >&2
		exit 1
	fi
fi
mkdir -p "$cache"
mv "$tmp/$member" "$lib.tmp"
mv "$lib.tmp" "$lib"
echo "setup: ONNX Runtime $ORT_NPM_VERSION installed in $lib"
