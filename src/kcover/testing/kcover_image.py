"""The kcover image, built here the way the Dockerfile builds it, without an image engine.

The real-node tests install the Helm chart as users do, so they need the image
the chart names. There is no Docker engine or registry on the test machines, so
this module builds it from ``hack/kcover-image/spec.sh`` — the file the
Dockerfile's ``RUN`` steps read too — with Debian's own tools:

1. a Debian root file system (``debootstrap --variant=minbase``, the release and
   packages of the spec) with a virtual environment at the spec's ``VENV``,
   kept as ``base-<hash of the spec>.tar`` so a rebuild does not download it again;
2. wheels of this checkout with the spec's extras and every dependency
   (``pip wheel``, on this machine), installed into that environment inside
   the root file system (``chroot``, ``--no-index``);
3. one layer of that root file system, written as an OCI archive
   (:mod:`kcover.testing.images`) named ``kcover.local/kcover:<hash>``, run as
   the spec's user with ``<VENV>/bin/kcover`` as the entry point.

The archive is cached in the test cluster's cache folder, keyed by the hash of
the spec, ``pyproject.toml`` and the sources, so ``make test`` rebuilds it only
when kcover changed. Needs root, ``debootstrap`` and Debian's mirror.

    python -m kcover.testing.kcover_image          # build if needed; print the archive and the name
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kcover.testing import images
from kcover.testing.binaries import find_binaries, hack_dir

__all__ = ["KcoverImage", "build", "find", "read_spec"]

MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class KcoverImage:
    archive: Path
    name: str

    @property
    def repository(self) -> str:
        return self.name.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.name.rsplit(":", 1)[1]


def spec_file() -> Path:
    return hack_dir().parent / "kcover-image" / "spec.sh"


def read_spec() -> dict[str, str]:
    """The ``KEY=value`` lines of the spec (shell quoting and trailing comments removed)."""
    values: dict[str, str] = {}
    for line in spec_file().read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and "=" in words[0]:
            key, value = words[0].split("=", 1)
            values[key] = value
    return values


def _repo() -> Path:
    return hack_dir().parent.parent


def source_hash() -> str:
    """What the image is made of: the spec, the project's metadata and every source file."""
    repo = _repo()
    digest = hashlib.sha256()
    files = [spec_file(), repo / "pyproject.toml", repo / "README.md"]
    files += sorted(p for p in (repo / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _folder() -> Path:
    return find_binaries().root / "images"


def find() -> KcoverImage | None:
    """The image of the current sources, if it was built."""
    key = source_hash()
    archive = _folder() / f"kcover-{key}.tar"
    return KcoverImage(archive, f"kcover.local/kcover:{key}") if archive.exists() else None


def _run(*argv: str, log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"{shlex.join(argv[:4])} … failed (exit {done.returncode}); see {log}:\n"
                           + "\n".join(lines))


def _base(spec: dict[str, str], work: Path, log: Path) -> Path:
    """The Debian root file system with the empty virtual environment, from the cache or built."""
    key = hashlib.sha256(spec_file().read_bytes()).hexdigest()[:16]
    cached = _folder() / f"base-{key}.tar"
    rootfs = work / "rootfs"
    rootfs.mkdir()
    if not cached.exists():
        packages = ",".join(spec["DEBIAN_PACKAGES"].split())
        _run("debootstrap", "--variant=minbase", f"--include={packages}", spec["DEBIAN_RELEASE"],
             str(rootfs), MIRROR, log=log)
        _run("chroot", str(rootfs), "python3", "-m", "venv", spec["VENV"], log=log)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / cache, ignore_errors=True)
            (rootfs / cache).mkdir(parents=True)
        partial = cached.with_suffix(".tmp")
        _run("tar", "-C", str(rootfs), "-cpf", str(partial), ".", log=log)
        partial.replace(cached)
        return rootfs
    _run("tar", "-C", str(rootfs), "-xpf", str(cached), log=log)
    return rootfs


def build() -> KcoverImage:
    """Build the image of the current sources unless it is cached; return it."""
    found = find()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise RuntimeError("building the kcover image needs root and debootstrap (apt-get install debootstrap)")
    spec, key = read_spec(), source_hash()
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    log.write_text("")
    work = Path(tempfile.mkdtemp(prefix="kcover-image-", dir=folder))
    try:
        rootfs = _base(spec, work, log)
        wheels = rootfs / "tmp" / "wheels"
        _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels),
             f"{_repo()}[{spec['KCOVER_EXTRAS']}]", log=log)
        _run("chroot", str(rootfs), f"{spec['VENV']}/bin/pip", "install", "--quiet", "--no-index",
             "--no-compile", "--find-links", "/tmp/wheels", f"kcover[{spec['KCOVER_EXTRAS']}]", log=log)
        shutil.rmtree(wheels)
        layer = images.layer_from_folder(rootfs, work / "layer.tar")
        image = KcoverImage(folder / f"kcover-{key}.tar", f"kcover.local/kcover:{key}")
        images.write_oci_archive(image.archive, image.name, layer, [f"{spec['VENV']}/bin/kcover"],
                                 user=spec["IMAGE_USER"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in folder.glob("kcover-*.tar"):
        if old != image.archive:
            old.unlink(missing_ok=True)
    return image


def main() -> int:
    try:
        image = build()
    except (RuntimeError, OSError) as err:
        print(f"kcover image: {err}", file=sys.stderr)
        return 1
    print(image.archive)
    print(image.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
