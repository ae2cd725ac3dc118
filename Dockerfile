# The kcover image: the agent and the operator (`kcover agent`, `kcover operator`).
# Build: docker build -t kcover:0.1.0 .   (then set image.repository/tag in charts/kcover/values.yaml)
# What goes in is hack/kcover-image/spec.sh; kcover.testing.kcover_image builds the same image without
# an image engine (debootstrap + chroot) for the tests on real nodes; tests/cluster/test_kcover_image.py
# checks that the two stay equal.
FROM debian:bookworm-slim
COPY hack/kcover-image/spec.sh /tmp/spec.sh
RUN . /tmp/spec.sh \
 && apt-get update && apt-get install -y --no-install-recommends $DEBIAN_PACKAGES \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv "$VENV"
COPY pyproject.toml README.md /src/
COPY src /src/src
# GPU checks use NVML (nvidia-ml-py, the gpu extra) from the host driver when present.
RUN . /tmp/spec.sh && "$VENV/bin/pip" install --no-cache-dir "/src[$KCOVER_EXTRAS]" && rm -rf /src /tmp/spec.sh
USER 65532:65532
ENTRYPOINT ["/opt/kcover/bin/kcover"]
