"""InfiniBand / RoCE ports from sysfs: state, physical state, rate, and link flaps.

Every port under ``/sys/class/infiniband/<device>/ports/<n>/`` is read
(``state`` ``4: ACTIVE``, ``phys_state`` ``5: LinkUp``, ``rate``
``400 Gb/sec (4X NDR)``, ``link_layer`` InfiniBand or Ethernet for RoCE,
``counters/link_downed``).  A port that is not active and up fails; a port
slower than ``network.min_rate_gbps`` (or, unset, than the node's fastest
port) fails.  ``link_downed`` only grows, so a flap is an increase since the
previous run: the counters are kept in a small JSON file between runs.  No
device: ``skipped``.  The root is configurable so tests use a sysfs-shaped
folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kcover.health.model import Outcome, Status
from kcover.health.registry import CheckContext, register


@dataclass(frozen=True)
class IbPort:
    device: str
    port: str
    state: str
    phys_state: str
    rate_gbps: float | None
    link_layer: str
    link_downed: int | None

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state.endswith("ACTIVE") and self.phys_state.endswith("LinkUp")


def _attr(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def read_ports(root: Path) -> list[IbPort]:
    """Every port of every device under ``root``, sorted by name."""
    ports = []
    for port_dir in sorted(root.glob("*/ports/*")):
        rate = re.match(r"\s*([\d.]+)\s*Gb/sec", _attr(port_dir / "rate"))
        downed = _attr(port_dir / "counters" / "link_downed")
        ports.append(
            IbPort(
                device=port_dir.parent.parent.name,
                port=port_dir.name,
                state=_attr(port_dir / "state"),
                phys_state=_attr(port_dir / "phys_state"),
                rate_gbps=float(rate.group(1)) if rate else None,
                link_layer=_attr(port_dir / "link_layer") or "InfiniBand",
                link_downed=int(downed) if downed.isdigit() else None,
            )
        )
    return ports


def judge_ports(ports: list[IbPort], min_rate: float | None) -> Outcome:
    down = [port for port in ports if not port.up]
    if down:
        port = down[0]
        return Outcome(
            Status.FAIL,
            f"{port.name} ({port.link_layer}) is {port.state or '?'} / "
            f"{port.phys_state or '?'}" + (f"; {len(down)} ports down" if len(down) > 1 else ""),
            len(down),
            "ports down",
            0,
        )
    rates = [port.rate_gbps for port in ports if port.rate_gbps is not None]
    floor = min_rate if min_rate is not None else max(rates, default=0.0)
    slow = [port for port in ports if port.rate_gbps is not None and port.rate_gbps < floor]
    if slow:
        port = slow[0]
        return Outcome(
            Status.FAIL,
            f"{port.name} at {port.rate_gbps:g} Gb/s, below {floor:g} Gb/s (degraded link)",
            port.rate_gbps,
            "Gb/s",
            floor,
        )
    slowest = min(rates, default=0.0)
    layers = sorted({port.link_layer for port in ports})
    return Outcome(
        Status.PASS, f"{len(ports)} {'/'.join(layers)} ports active at ≥ {slowest:g} Gb/s", slowest, "Gb/s", floor
    )


def judge_flaps(ports: list[IbPort], previous: dict[str, int], max_delta: int) -> Outcome:
    counted = {port.name: port.link_downed for port in ports if port.link_downed is not None}
    if not counted:
        return Outcome.skipped("no link_downed counters")
    if not previous:
        return Outcome(
            Status.PASS,
            f"baseline recorded for {len(counted)} ports (flaps are counted from now)",
            0,
            "flaps",
            max_delta,
        )
    deltas = {name: count - previous[name] for name, count in counted.items() if name in previous}
    worst_name, worst = max(deltas.items(), key=lambda item: item[1], default=("", 0))
    if worst > max_delta:
        return Outcome(
            Status.FAIL,
            f"{worst_name} went down {worst}× since the previous check (link flap)",
            worst,
            "flaps",
            max_delta,
        )
    return Outcome(
        Status.PASS,
        f"no link flaps on {len(counted)} ports since the previous check",
        max(worst, 0),
        "flaps",
        max_delta,
    )


def _root(ctx: CheckContext) -> Path:
    return Path(ctx.config.network.sysfs_root)


@register("network.ib_ports", "InfiniBand/RoCE ports active, up and at full rate (sysfs)")
class IbPorts:
    def run(self, ctx: CheckContext) -> Outcome:
        ports = read_ports(_root(ctx))
        if not ports:
            return Outcome.skipped(f"no InfiniBand/RoCE device under {_root(ctx)}")
        return judge_ports(ports, ctx.config.network.min_rate_gbps)


@register("network.ib_flaps", "InfiniBand/RoCE link flaps (link_downed increase) since the previous check")
class IbFlaps:
    def run(self, ctx: CheckContext) -> Outcome:
        ports = read_ports(_root(ctx))
        if not ports:
            return Outcome.skipped(f"no InfiniBand/RoCE device under {_root(ctx)}")
        folder = Path(ctx.config.network.state_dir or Path.home() / ".cache" / "kcover" / "health")
        state = folder / "ib-link-downed.json"
        try:
            previous = {str(k): int(v) for k, v in json.loads(state.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            previous = {}
        outcome = judge_flaps(ports, previous, ctx.config.network.max_link_downed_delta)
        folder.mkdir(parents=True, exist_ok=True)
        current = {port.name: port.link_downed for port in ports if port.link_downed is not None}
        state.write_text(json.dumps(current))
        return outcome


def port_dict(port: IbPort) -> dict[str, object]:
    return asdict(port)
