"""DCGM diagnostics: run ``dcgmi diag -r LEVEL`` and judge its result table.

``dcgmi diag`` prints a table of tests (``| PCIe | Fail - GPU: 0 |``) with
``Warning``/``Error`` rows under a failed test.  :func:`parse_diag` reads that
table; :func:`judge_diag` turns it into one outcome naming the failed tests.
Without ``dcgmi`` on the PATH the check is ``skipped``.  Level 1 takes seconds,
level 2 about two minutes, so only the full suite runs it by default.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from kcover.health.model import Outcome, Status
from kcover.health.registry import CheckContext, register


@dataclass
class DiagTest:
    """One row of the ``dcgmi diag`` table: ``result`` is Pass, Fail, Warn or Skip."""

    name: str
    result: str
    detail: str = ""
    messages: list[str] = field(default_factory=list)


_RESULTS = ("pass", "fail", "warn", "skip")
_NOT_TESTS = {
    "diagnostic",
    "dcgm version",
    "driver version detected",
    "gpu device ids detected",
    "number of cpus detected",
    "cpu device ids detected",
    "gpu device serials detected",
}


def parse_diag(output: str) -> list[DiagTest]:
    """The tests of a ``dcgmi diag`` text table, in order, with their warning and error lines."""
    tests: list[DiagTest] = []
    for raw in output.splitlines():
        line = raw.strip()
        if not line.startswith("|") or line.startswith(("|---", "|===", "|-----")):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) < 2:
            continue
        name, result = cells[0], cells[1]
        if name.lower() in ("warning", "error", "info", "") and tests:
            if result:
                tests[-1].messages.append(f"{name or 'Info'}: {result}" if name else result)
            continue
        first = result.split(" - ", 1)
        if name.lower() in _NOT_TESTS or first[0].strip().lower() not in _RESULTS:
            continue
        tests.append(DiagTest(name, first[0].strip().capitalize(), first[1].strip() if len(first) > 1 else ""))
    return tests


def judge_diag(tests: list[DiagTest], level: int) -> Outcome:
    failed = [t for t in tests if t.result == "Fail"]
    warned = [t for t in tests if t.result == "Warn"]
    if failed:
        first = failed[0]
        why = f": {first.messages[0]}" if first.messages else ""
        names = ", ".join(f"{t.name} ({t.detail})" if t.detail else t.name for t in failed)
        return Outcome(Status.FAIL, f"dcgmi diag -r {level} failed {names}{why}", len(failed), "tests", 0)
    if warned:
        return Outcome(
            Status.WARN, f"dcgmi diag -r {level} warned: {', '.join(t.name for t in warned)}", len(warned), "tests", 0
        )
    ran = [t for t in tests if t.result == "Pass"]
    return Outcome(Status.PASS, f"dcgmi diag -r {level}: {len(ran)} tests passed", 0, "tests", 0)


@register("dcgm.diag", "DCGM diagnostics (dcgmi diag -r LEVEL) when DCGM is installed")
class DcgmDiag:
    def run(self, ctx: CheckContext) -> Outcome:
        cfg = ctx.config.dcgm
        command = shutil.which(cfg.command)
        if command is None:
            return Outcome.skipped(f"DCGM not installed ({cfg.command} not on PATH)")
        process = subprocess.run([command, "diag", "-r", str(cfg.level)], capture_output=True, text=True, check=False)
        tests = parse_diag(process.stdout)
        if not tests:
            text = (process.stderr or process.stdout).strip().splitlines()
            return Outcome(
                Status.ERROR,
                f"dcgmi exited {process.returncode} without a result table: {text[-1] if text else 'no output'}",
            )
        return judge_diag(tests, cfg.level)
