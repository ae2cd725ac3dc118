# The kcover image: the agent and the operator (`kcover agent`, `kcover operator`).
# Build: docker build -t kcover:0.1.0 .   (then set image.repository/tag in charts/kcover/values.yaml)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --prefix=/install ".[k8s]"

FROM python:3.11-slim
COPY --from=build /install /usr/local
# kopf and the kubernetes client need nothing else; GPU checks use NVML from the host driver when present.
RUN pip install --no-cache-dir nvidia-ml-py
USER 65532:65532
ENTRYPOINT ["kcover"]
