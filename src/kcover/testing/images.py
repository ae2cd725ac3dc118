"""Container images for the test cluster's real nodes, written without an image engine.

No registry is reachable from the test machines and there is no Docker engine, so
the images the real nodes run are written here as OCI image archives (an
``oci-layout``, ``index.json`` and content-addressed blobs in one tar) that
``ctr images import`` loads into a node's containerd:

- :data:`PAUSE_IMAGE` -- the pod sandbox: a static busybox that sleeps.
- :data:`HOST_RUNTIME_IMAGE` -- an almost empty root file system (the usual
  top-level folders, ``/bin``-style links into ``/usr``, a ``passwd`` with root,
  nobody and uid 65532). A pod using it mounts the host's ``/usr``, Python and
  the project read-only with hostPath volumes (:func:`host_runtime_mounts`), so
  it runs the same interpreter, torch and kcover as the tests without copying
  gigabytes into a layer.

Layers are uncompressed and written with fixed owners and times, so the same
inputs give the same digests (a second import is a no-op).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "HOST_RUNTIME_IMAGE",
    "PAUSE_IMAGE",
    "Entry",
    "HostMount",
    "host_runtime_mounts",
    "layer_from_folder",
    "write_host_runtime_image",
    "write_oci_archive",
    "write_pause_image",
]

PAUSE_IMAGE = "kcover.local/pause:1"
HOST_RUNTIME_IMAGE = "kcover.local/host-runtime:1"

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Entry:
    """One member of a layer: a folder (``data`` None, ``link`` None), a file or a symlink."""

    path: str
    data: bytes | None = None
    link: str | None = None
    mode: int = 0o755


@dataclass(frozen=True)
class HostMount:
    """A host folder a host-runtime pod mounts read-only at the same path."""

    name: str
    path: str


def _layer(entries: Iterable[Entry], dest: Path) -> Path:
    """A layer tar at ``dest`` holding ``entries``."""
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mtime = 0
            info.uid = info.gid = 0
            info.mode = entry.mode
            if entry.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return dest


# Kernel file systems and caches: kept as empty folders, never copied into a layer.
_EMPTY_IN_LAYER = {"proc", "sys", "dev", "run", "tmp", "var/cache/apt", "var/lib/apt/lists"}


def layer_from_folder(folder: Path, dest: Path) -> Path:
    """A layer tar at ``dest`` of the root file system in ``folder`` (owners, modes, links kept)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        rel = info.name.removeprefix("./")
        if any(rel.startswith(prefix + "/") for prefix in _EMPTY_IN_LAYER):
            return None
        info.mtime = 0
        return info

    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name, recursive=True, filter=keep)
    return dest


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _digest(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return {"digest": "sha256:" + sha.hexdigest(), "size": path.stat().st_size}


def write_oci_archive(
    dest: Path,
    name: str,
    layer: Iterable[Entry] | Path,
    entrypoint: list[str],
    env: Mapping[str, str] | None = None,
    user: str = "",
) -> Path:
    """Write a one-layer linux/amd64 image called ``name`` to ``dest`` (an OCI archive tar).

    ``layer`` is the layer's entries, or a layer tar already written (see :func:`layer_from_folder`).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    layer_file = layer if isinstance(layer, Path) else _layer(layer, dest.with_name(dest.name + ".layer"))
    try:
        return _write_archive(dest, name, layer_file, entrypoint, env or {}, user)
    finally:
        if layer_file is not layer:
            layer_file.unlink(missing_ok=True)


def _write_archive(dest: Path, name: str, layer: Path, entrypoint: list[str], env: Mapping[str, str],
                   user: str) -> Path:
    blobs: dict[str, bytes] = {}
    layer_ref = _digest(layer)
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Env": [f"{k}={v}" for k, v in {"PATH": _PATH, **env}.items()],
            "WorkingDir": "/",
            **({"User": user} if user else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]},
        "history": [{"created_by": "kcover.testing.images"}],
    }
    config_ref = _blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": {"mediaType": _CONFIG, **config_ref},
        "layers": [{"mediaType": _LAYER, **layer_ref}],
    }
    manifest_ref = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": _MANIFEST,
                **manifest_ref,
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    members = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in blobs.items()},
    }
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, data in members.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        tar.add(layer, arcname=f"blobs/sha256/{str(layer_ref['digest']).split(':', 1)[1]}")
    tmp.replace(dest)
    return dest


def _busybox() -> bytes:
    found = shutil.which("busybox")
    if found is None:
        raise FileNotFoundError(
            "busybox is not installed (the pause image needs a static busybox: "
            "apt-get install busybox-static)"
        )
    return Path(found).read_bytes()


def write_pause_image(dest: Path) -> Path:
    """The sandbox image: ``/bin/busybox sleep infinity`` on an otherwise empty root."""
    entries = [Entry("bin"), Entry("bin/busybox", _busybox()), Entry("dev"), Entry("proc")]
    return write_oci_archive(
        dest, PAUSE_IMAGE, entries, ["/bin/busybox", "sleep", "2147483647"]
    )


_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n" + (
    b"nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/false\n"
)
_GROUP = b"root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n"


def write_host_runtime_image(dest: Path) -> Path:
    """The workload image: top-level folders and links into ``/usr``, nothing else."""
    entries = [Entry(d) for d in ("usr", "etc", "root", "home", "home/nonroot", "var", "run")]
    entries += [Entry(link, link=f"usr/{link}") for link in ("bin", "sbin", "lib", "lib64")]
    entries += [Entry("tmp", mode=0o1777), Entry("var/tmp", mode=0o1777)]
    entries += [Entry("etc/passwd", _PASSWD, mode=0o644), Entry("etc/group", _GROUP, mode=0o644)]
    return write_oci_archive(dest, HOST_RUNTIME_IMAGE, entries, ["/bin/sh"])


def host_runtime_mounts(project_root: Path) -> list[HostMount]:
    """The host folders a host-runtime pod needs: ``/usr``, the Python install, the project.

    Nested folders are dropped (mounting the parent brings them along); every
    path is resolved so that symlinked virtual environments still work.
    """
    wanted = [
        Path("/usr"),
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        project_root.resolve(),
    ]
    kept: list[Path] = []
    for path in sorted(set(wanted), key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return [HostMount(f"host-{i}", str(path)) for i, path in enumerate(kept)]
