"""The manifest: the small JSON file whose atomic rename commits one rank's checkpoint.

It names the image file and records its size, per-block CRC-32 checksums, the
step, the rank and the world size that wrote it — and a checksum of itself, so
a bit flip in the manifest is caught as surely as one in the data.  A
checkpoint without a readable, self-consistent manifest does not exist.
Written by :mod:`kcover.checkpoint.disk`, read by the same module on load.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from kcover.checkpoint.errors import CorruptCheckpointError

FORMAT = "kcover-checkpoint/1"


@dataclass(frozen=True)
class Manifest:
    step: int
    rank: int
    world_size: int
    replicated: bool
    file: str
    size: int
    block_size: int
    crc32: tuple[int, ...]
    written_at: float

    def to_json(self) -> bytes:
        body = {"format": FORMAT, **asdict(self), "crc32": list(self.crc32)}
        body["checksum"] = _checksum(body)
        return json.dumps(body, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            body = json.loads(data)
            checksum = body.pop("checksum")
            if checksum != _checksum(body):
                raise ValueError("checksum mismatch")
            if body.pop("format") != FORMAT:
                raise ValueError("unknown format")
            body["crc32"] = tuple(int(c) for c in body["crc32"])
            manifest = cls(**body)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"{where}: unreadable manifest ({exc})") from None
        expected_blocks = -(-manifest.size // manifest.block_size) if manifest.block_size > 0 else -1
        if expected_blocks != len(manifest.crc32):
            raise CorruptCheckpointError(f"{where}: manifest lists {len(manifest.crc32)} checksums, expected "
                                         f"{expected_blocks}")
        return manifest


def _checksum(body: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())
