# What the kcover image (the agent and the operator) holds. Read by both builds, so they stay equal:
# the Dockerfile (`. spec.sh` in its RUN steps) and kcover.testing.kcover_image, which builds the same
# image here without an image engine (debootstrap + chroot) for the real-node tests.
DEBIAN_RELEASE=bookworm                               # the Dockerfile's FROM is debian:${DEBIAN_RELEASE}-slim
DEBIAN_PACKAGES="python3 python3-venv ca-certificates"
VENV=/opt/kcover                                      # kcover and its Python packages
KCOVER_EXTRAS="k8s,gpu"                               # kubernetes client, kopf, prometheus-client, nvidia-ml-py
IMAGE_USER=65532:65532
