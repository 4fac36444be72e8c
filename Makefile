# Prism's build. `make setup` fetches what the build needs (idempotent);
# `make demo` is the main job end to end; `make test` is what CI runs.
SHELL := /bin/bash
GO ?= go
ORT_NPM_VERSION := 1.30.0
ORT_CACHE_LIB := $(CURDIR)/.cache/ort/$(ORT_NPM_VERSION)/libonnxruntime.so
# The CUDA build (make setup-cuda), where installed, as the binary prefers it.
ORT_CUDA_LIB := $(CURDIR)/.cache/ort/1.29.0-cuda13/libonnxruntime.so
export ORT_LIB ?= $(if $(wildcard $(ORT_CUDA_LIB)),$(ORT_CUDA_LIB),$(ORT_CACHE_LIB))
BIN := bin/prism

.PHONY: setup setup-cuda build test demo proto bench bench-score bench-serve bench-tls bench-context vet fmt clean kube-apiserver manifests image

setup:
	@ORT_LIB=$(filter-out $(ORT_CACHE_LIB) $(ORT_CUDA_LIB),$(ORT_LIB)) ./scripts/setup-ort.sh

# A CUDA build of ONNX Runtime for GPU hosts (the prism binary prefers it
# when present): scripts/setup-ort-cuda.sh.
setup-cuda:
	./scripts/setup-ort-cuda.sh

build:
	$(GO) build -o $(BIN) ./cmd/prism

vet:
	$(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The store benchmark's Redis tests need redis-server: installed from
# Debian when missing (no daemon is started); without it they skip.
test: setup
	@command -v redis-server >/dev/null || ! command -v apt-get >/dev/null || { echo "test: installing Debian's redis-server (the store benchmark's Redis tests)"; apt-get install -y redis-server >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y redis-server >/dev/null 2>&1; } || echo "test: could not install redis-server; the Redis tests skip"; }
	@command -v npm >/dev/null || { echo "test: no npm: TestNodeInterop skips"; exit 0; }; [ -d scripts/interop/node/node_modules ] || { echo "test: installing the Node interop check's modules (npm ci in scripts/interop/node)"; (cd scripts/interop/node && npm ci --no-audit --no-fund >/dev/null 2>&1) || echo "test: npm ci failed; TestNodeInterop skips"; }
	@[ -x .cache/bin/promtool ] || command -v promtool >/dev/null || { echo "test: installing promtool into .cache/bin (the alerting rules' checks; about 3 minutes on 2 cores)"; GOBIN=$(CURDIR)/.cache/bin $(GO) install github.com/prometheus/prometheus/cmd/promtool@v0.316.0 || echo "test: could not install promtool; TestRulesPromtool skips"; }
	@[ -x .cache/bin/helm ] || command -v helm >/dev/null || { echo "test: installing helm v3.22.0 into .cache/bin (the chart's lint and rendering tests; about 2 minutes on 2 cores)"; GOBIN=$(CURDIR)/.cache/bin $(GO) install helm.sh/helm/v3/cmd/helm@v3.22.0 || echo "test: could not install helm; the chart tests skip"; }
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 15m ./...

# The main job end to end on embedded defaults (scripts/demo.sh): build
# dlrm-kaggle, score it whole, partition it, ingest its tables, serve it
# with prism up and send it load.
demo: setup build
	./scripts/demo.sh

bench: setup
	$(GO) test -run '^$$' -bench . ./...

# Disaggregated serving against the monolith (needs make demo's artifacts).
bench-serve: setup build
	./scripts/bench-serve.sh

# Mutual TLS against plaintext serving (needs make demo's artifacts).
bench-tls: setup build
	./scripts/bench-tls.sh

# The user context (13 sparse features once per request) against every
# feature per candidate, and the monolith (needs make demo's artifacts).
bench-context: setup build
	./scripts/bench-context.sh

# Monolithic scoring throughput table for BENCHMARKS.md.
bench-score: setup build
	./scripts/bench-score.sh

# Regenerates internal/onnxpb/onnx.pb.go and api/ with protoc (Debian: protobuf-compiler)
# and the protoc-gen-go / protoc-gen-go-grpc pinned in go.mod's tool block.
proto:
	@command -v protoc >/dev/null || { echo "make proto: protoc not found; installing Debian's protobuf-compiler"; apt-get install -y protobuf-compiler >/dev/null || { echo "make proto: install protoc (apt-get install protobuf-compiler)"; exit 1; }; }
	$(GO) build -o .cache/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o .cache/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	protoc --plugin=protoc-gen-go=.cache/protoc-gen-go --go_out=. --go_opt=paths=source_relative internal/onnxpb/onnx.proto
	protoc --plugin=protoc-gen-go=.cache/protoc-gen-go --plugin=protoc-gen-go-grpc=.cache/protoc-gen-go-grpc \
		--go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative api/prismv1/*.proto

# Plain Kubernetes manifests (deploy/manifests, for kubectl apply -k),
# rendered from the Helm chart with its default values, and the alerting
# rules' copy for a plain Prometheus (deploy/monitoring). Helm: on PATH or
# GOBIN=$(CURDIR)/.cache/bin go install helm.sh/helm/v3/cmd/helm@v3.22.0
HELM ?= $(shell command -v helm 2>/dev/null || echo $(CURDIR)/.cache/bin/helm)
manifests:
	@[ -x "$(HELM)" ] || { echo "make manifests: helm not found: GOBIN=$(CURDIR)/.cache/bin go install helm.sh/helm/v3/cmd/helm@v3.22.0"; exit 1; }
	$(HELM) lint deploy/helm/prism
	$(HELM) template prism deploy/helm/prism --namespace prism > deploy/manifests/prism.yaml
	cp deploy/helm/prism/files/prism-rules.yaml deploy/monitoring/prism-rules.yaml
	cp deploy/helm/prism/files/prism-dashboard.json deploy/monitoring/prism-dashboard.json

# The container image (Dockerfile): needs docker or podman with a working
# engine and access to the registries the Dockerfile pulls from.
IMAGE ?= prism:dev
image:
	@engine=; for e in docker podman; do if command -v $$e >/dev/null 2>&1 && timeout 20 $$e info >/dev/null 2>&1; then engine=$$e; break; fi; done; \
	if [ -z "$$engine" ]; then echo "make image: no usable container engine here (docker/podman missing or its daemon not reachable); build where one runs with registry access: docker build -t $(IMAGE) ."; exit 1; fi; \
	echo "$$engine build -t $(IMAGE) ."; $$engine build -t $(IMAGE) .

# kube-apiserver (from the k8s.io/kubernetes module) and etcd for the
# tests against a real API server; they skip without them.
kube-apiserver:
	./scripts/build-kube-apiserver.sh

clean:
	rm -rf bin .cache/protoc-gen-go .cache/protoc-gen-go-grpc
