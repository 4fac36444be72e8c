#!/usr/bin/env bash
# Builds kube-apiserver from the k8s.io/kubernetes module into
# .cache/k8s/kube-apiserver, for the tests against a real API server
# (internal/kubetest; they skip without it). A scratch module imports
# cmd/kube-apiserver/app and replaces each k8s.io/* staging module with
# its published version of the same release. About 15 minutes on 2
# cores the first time; idempotent. Also needs etcd: apt-get install
# etcd-server (done here when apt-get is available).
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION=${K8S_VERSION:-1.37.2}
STAGING_VERSION=0.${K8S_VERSION#1.}
out=.cache/k8s/kube-apiserver
if [ -x "$out" ] && [ "$(cat .cache/k8s/version 2>/dev/null)" = "$K8S_VERSION" ]; then
	echo "kube-apiserver $K8S_VERSION already in $out"
else
	mkdir -p .cache/k8s/build
	cd .cache/k8s/build
	gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	cat > main.go <<'GO'
// A scratch command: kube-apiserver built from the k8s.io/kubernetes
// module, for Prism's tests against a real API server.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
	{
		echo "module prism-k8s-build"; echo; echo "go $(sed -n 's/^go //p' "$gomod")"; echo
		echo "require k8s.io/kubernetes v$K8S_VERSION"; echo; echo "replace ("
		for m in $(grep -E "=> ./staging" "$gomod" | awk '{print $1}' | sort -u); do echo "	$m => $m v$STAGING_VERSION"; done
		echo ")"
	} > go.mod
	go mod tidy
	echo "building kube-apiserver $K8S_VERSION (about 15 minutes on 2 cores)..."
	go build -o ../kube-apiserver .
	cd ../../..
	echo "$K8S_VERSION" > .cache/k8s/version
	echo "kube-apiserver $K8S_VERSION in $out"
fi
if ! command -v etcd >/dev/null; then
	if command -v apt-get >/dev/null; then
		apt-get install -y etcd-server >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y etcd-server >/dev/null; }
	else
		echo "no etcd: install etcd-server"; exit 1
	fi
fi
echo "etcd: $(command -v etcd)"
