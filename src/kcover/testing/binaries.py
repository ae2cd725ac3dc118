"""Where the test cluster's programs are, and which of them are missing.

``hack/test-cluster/build`` compiles etcd, the Kubernetes control plane, KWOK
and the optional controllers from pinned Go modules into a versioned cache,
``~/.cache/kcover-test-cluster/<k8s version>/`` (``bin/``, ``crds/``,
``unavailable/<name>.txt`` for an optional program that failed to build, with
the Go error). This module finds that folder the same way the build script
does (the Kubernetes version comes from ``hack/test-cluster/k8s/go.mod``) so
the harness never needs to be told, and says precisely what is missing.

Overrides, in order: ``KCOVER_TEST_CLUSTER_DIR`` (the versioned folder itself),
``KCOVER_TEST_CLUSTER_CACHE`` (the cache root), ``XDG_CACHE_HOME``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OPTIONAL",
    "REQUIRED",
    "Binaries",
    "BinariesMissingError",
    "find_binaries",
    "hack_dir",
]

REQUIRED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
OPTIONAL = ("kubectl", "kubelet", "helm", "jobset", "training-operator")

_MARKER = Path("hack") / "test-cluster" / "build"


class BinariesMissingError(RuntimeError):
    """Required test-cluster programs are not built; the message says how to build them."""


def hack_dir(start: Path | None = None) -> Path:
    """The repository's ``hack/test-cluster`` folder, found upward from ``start``/cwd/this file."""
    candidates = [start] if start else [Path.cwd(), Path(__file__).resolve()]
    for base in candidates:
        for folder in [base, *base.parents]:
            if (folder / _MARKER).is_file():
                return folder / _MARKER.parent
    raise FileNotFoundError(
        "cannot find hack/test-cluster/build above the current directory or the kcover package; "
        "run from a kcover checkout or set KCOVER_TEST_CLUSTER_DIR"
    )


def _k8s_version(hack: Path) -> str:
    text = (hack / "k8s" / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", text, re.MULTILINE)
    if not match:
        raise ValueError(f"no k8s.io/kubernetes requirement in {hack / 'k8s' / 'go.mod'}")
    return match.group(1)


def cache_dir() -> Path:
    """The versioned cache folder the build script writes to."""
    explicit = os.environ.get("KCOVER_TEST_CLUSTER_DIR")
    if explicit:
        return Path(explicit)
    root = os.environ.get("KCOVER_TEST_CLUSTER_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "kcover-test-cluster")
    return Path(root) / _k8s_version(hack_dir())


@dataclass(frozen=True)
class Binaries:
    """The cache folder of one build: programs, CRDs, and reasons for what is absent."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def path(self, name: str) -> Path:
        return self.bin / name

    def has(self, name: str) -> bool:
        return os.access(self.path(name), os.X_OK)

    def missing(self, names: tuple[str, ...] = REQUIRED) -> list[str]:
        return [name for name in names if not self.has(name)]

    def why_missing(self, name: str) -> str:
        """Why ``name`` is not there: the recorded Go error, or 'not built'."""
        note = self.root / "unavailable" / f"{name}.txt"
        if note.is_file():
            return note.read_text().strip()
        return f"{name} is not built in {self.bin} (run hack/test-cluster/build)"

    def crds(self, group: str) -> list[Path]:
        """The CRD YAML files copied for ``group`` (``jobset``, ``training-operator``)."""
        folder = self.root / "crds" / group
        return sorted(folder.glob("*.yaml")) if folder.is_dir() else []

    def require(self) -> None:
        missing = self.missing()
        if missing:
            reasons = [
                f"  {name}: {self.why_missing(name)}"
                for name in missing
                if (self.root / "unavailable" / f"{name}.txt").is_file()
            ]
            raise BinariesMissingError(
                f"test-cluster programs missing from {self.bin}: {', '.join(missing)}. "
                "Build them with hack/test-cluster/build (cold: 10-30 min)."
                + ("\nThe last build failed:\n" + "\n".join(reasons) if reasons else "")
            )


def find_binaries() -> Binaries:
    """The :class:`Binaries` of this checkout (the folder may not exist yet)."""
    return Binaries(cache_dir())
