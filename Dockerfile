# Prism's container image: `make image` (docker or podman), or
#   docker build -t prism:dev .
# The build stage fetches Go modules, ONNX Runtime (npm package
# onnxruntime-node, checksums pinned in scripts/setup-ort.sh) and
# grpc_health_probe (the chart's probes over mutual TLS): it needs access
# to those registries. The runtime stage is Debian slim with the binary,
# libonnxruntime.so (the CPU build: see README "ONNX Runtime" for a CUDA
# build) and a non-root user.

FROM golang:1.26-trixie AS build
RUN apt-get update \
	&& apt-get install -y --no-install-recommends npm \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make setup && make build \
	&& GOBIN=/out go install github.com/grpc-ecosystem/grpc-health-probe@v0.4.61 \
	&& cp bin/prism /out/prism \
	&& cp .cache/ort/1.30.0/libonnxruntime.so /out/libonnxruntime.so

FROM debian:trixie-slim
RUN groupadd --gid 10001 prism \
	&& useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin prism
COPY --from=build /out/prism /out/grpc-health-probe /usr/local/bin/
COPY --from=build /out/libonnxruntime.so /usr/local/lib/onnxruntime/libonnxruntime.so
RUN ln -s grpc-health-probe /usr/local/bin/grpc_health_probe
ENV ORT_LIB=/usr/local/lib/onnxruntime/libonnxruntime.so
USER 10001:10001
WORKDIR /var/lib/prism
# Router 8500, embedding 8501, dense 8502 (gRPC); 9090-9092 /metrics (the
# chart's ports; each command takes --addr and --metrics-addr).
EXPOSE 8500 8501 8502 9090 9091 9092
ENTRYPOINT ["prism"]
CMD ["--help"]
