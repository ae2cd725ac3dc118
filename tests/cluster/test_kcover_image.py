"""The kcover image built here (kcover.testing.kcover_image) and the Dockerfile stay the same image."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from kcover.testing import kcover_image

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def test_the_dockerfile_builds_what_the_spec_says() -> None:
    spec, text = kcover_image.read_spec(), DOCKERFILE.read_text()
    assert re.search(rf"^FROM debian:{spec['DEBIAN_RELEASE']}-slim$", text, re.MULTILINE)
    assert "COPY hack/kcover-image/spec.sh /tmp/spec.sh" in text
    assert 'apt-get install -y --no-install-recommends $DEBIAN_PACKAGES' in text
    assert 'python3 -m venv "$VENV"' in text
    assert '"$VENV/bin/pip" install --no-cache-dir "/src[$KCOVER_EXTRAS]"' in text
    assert f"USER {spec['IMAGE_USER']}" in text.splitlines()
    assert f'ENTRYPOINT ["{spec["VENV"]}/bin/kcover"]' in text.splitlines()


def test_the_built_image_runs_kcover_as_the_spec_says() -> None:
    image = kcover_image.find()
    if image is None:
        pytest.skip("the kcover image of this checkout is not built (python -m kcover.testing.kcover_image)")
    spec = kcover_image.read_spec()
    with tarfile.open(image.archive) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        [entry] = index["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == image.name

        def blob(digest: str) -> tarfile.ExFileObject:
            found = archive.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert found is not None
            return found

        manifest = json.load(blob(entry["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))["config"]
        assert config["User"] == spec["IMAGE_USER"]
        assert config["Entrypoint"] == [f"{spec['VENV']}/bin/kcover"]
        with tarfile.open(fileobj=blob(manifest["layers"][0]["digest"])) as layer:
            names = set(layer.getnames())
    venv = spec["VENV"].lstrip("/")
    assert f"{venv}/bin/kcover" in names
    assert any(n.startswith(f"{venv}/lib/python3.11/site-packages/kopf/") for n in names)
    assert any(n.startswith(f"{venv}/lib/python3.11/site-packages/pynvml") for n in names)
    assert not any(n.startswith(("proc/", "tmp/wheels")) for n in names)
