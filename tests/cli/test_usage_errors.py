"""Usage errors at kcover's command line, as a user meets them: a real ``kcover`` process each time.

Every numeric option of every command is tried with the values a parser accepts
but a command cannot honour (0, -1, nan, inf, huge): each is exit 2, one line on
stderr naming the option and the value, nothing started; with ``--json`` stdout
holds exactly one JSON object saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def kcover(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd, stdin=subprocess.DEVNULL)


def assert_usage_error(done: subprocess.CompletedProcess[str], *named: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kcover: ")
    for text in named:
        assert text in lines[0], (text, lines[0])


RUN_VALUES = [
    ("--hang-timeout", "0"), ("--hang-timeout", "-5"), ("--hang-timeout", "nan"), ("--hang-timeout", "inf"),
    ("--hang-timeout", "1e999"), ("--hang-timeout", "1e300"),
    ("--startup-timeout", "nan"), ("--startup-timeout", "0"), ("--startup-timeout", "-1"),
    ("--grace-period", "nan"), ("--grace-period", "-1"), ("--grace-period", "inf"),
    ("--backoff", "nan"), ("--backoff", "-1"),
    ("--nproc-per-node", "0"), ("--nproc-per-node", "-1"), ("--nproc-per-node", "100000000"),
    ("--nnodes", "0"), ("--spare-nodes", "-1"), ("--max-restarts", "-1"),
    ("--max-restarts", "99999999999999999999999"), ("--user-code-retries", "-1"), ("--min-nodes", "0"),
]


@pytest.mark.parametrize(("option", "value"), RUN_VALUES)
def test_run_refuses_a_value_it_cannot_honour_and_starts_nothing(tmp_path: Path, option: str, value: str) -> None:
    state = tmp_path / "state"
    done = kcover("run", "--preflight", "--state-dir", str(state), option, value, "--", sys.executable, "-c", "")
    assert_usage_error(done, option, f"(got {value.replace('1e999', 'inf').replace('1e300', '1e+300')})")
    assert not state.exists()


def test_run_refuses_more_minimum_nodes_than_nodes(tmp_path: Path) -> None:
    done = kcover("run", "--state-dir", str(tmp_path / "s"), "--min-nodes", "5", "--nnodes", "1", "--", "true")
    assert_usage_error(done, "--min-nodes", "--nnodes (1)", "(got 5)")
    assert not (tmp_path / "s").exists()


def test_run_refuses_more_workers_than_one_machine_starts(tmp_path: Path) -> None:
    done = kcover("run", "--state-dir", str(tmp_path / "s"), "--nproc-per-node", "1000", "--nnodes", "1000", "--",
                  "true")
    assert_usage_error(done, "--nproc-per-node", "4096", "(got 1000000)")


OTHER_VALUES = [
    (["check", "--timeout"], "0"), (["check", "--timeout"], "nan"), (["check", "--timeout"], "-1"),
    (["check", "--timeout"], "inf"),
    (["preflight", "--simulate-nodes"], "1"), (["preflight", "--simulate-nodes"], "-1"),
    (["preflight", "--simulate-nodes"], "100000"),
    (["agent", "--node", "n1", "--health-interval"], "-1"), (["agent", "--node", "n1", "--health-interval"], "nan"),
    (["agent", "--node", "n1", "--health-interval"], "inf"), (["agent", "--node", "n1", "--release-after"], "0"),
    (["agent", "--node", "n1", "--metrics-port"], "0"), (["agent", "--node", "n1", "--metrics-port"], "70000"),
    (["agent", "--node", "n1", "--snapshot-max-age"], "nan"), (["agent", "--node", "n1", "--snapshot-max-age"], "0"),
    (["operator", "--lease-seconds"], "0"), (["operator", "--lease-seconds"], "nan"),
    (["operator", "--lease-seconds"], "0.5"), (["operator", "--metrics-port"], "-1"),
]


@pytest.mark.parametrize(("command", "value"), OTHER_VALUES, ids=lambda item: " ".join(item) if isinstance(
    item, list) else item)
def test_every_numeric_option_refuses_what_it_cannot_honour(command: list[str], value: str) -> None:
    done = kcover(*command, value)
    assert_usage_error(done, command[-1], f"(got {value})")


def test_a_value_that_is_not_a_number_is_one_line() -> None:
    done = kcover("run", "--hang-timeout", "soon", "--", "true")
    assert_usage_error(done, "--hang-timeout", "kcover run --help")
    assert "╭" not in done.stderr


def test_json_usage_error_is_one_object_on_stdout(tmp_path: Path) -> None:
    cases = [
        ("run", "--json", "--hang-timeout", "nan", "--", "true"),
        ("run", "--json", "--state-dir", str(tmp_path / "s"), "--", "no-such-trainer"),
        ("run", "--json", "--frobnicate", "--", "true"),
        ("explain", "--json", str(tmp_path / "missing.log")),
        ("explain", "--json", "--engine", "magic"),
        ("preflight", "--json", "--simulate-nodes", "1"),
        ("check", "--json", "--suite", "nope"),
        ("history", "--json", "--state-dir", str(tmp_path / "empty")),
    ]
    for args in cases:
        done = kcover(*args)
        assert done.returncode == 2, (args, done.stderr)
        document = json.loads(done.stdout)
        assert document["status"] == "usage_error", args
        assert document["error"] == done.stderr.strip().splitlines()[-1].removeprefix("kcover: "), args


def test_json_after_the_double_dash_belongs_to_the_training_command(tmp_path: Path) -> None:
    done = kcover("run", "--hang-timeout", "0", "--", "trainer", "--json")
    assert_usage_error(done, "--hang-timeout")
    assert done.stdout == ""


def test_preflight_never_runs_for_a_command_that_does_not_exist(tmp_path: Path) -> None:
    done = kcover("run", "--preflight", "--state-dir", str(tmp_path / "state"), "--", str(tmp_path / "nope"))
    assert_usage_error(done, "command not found")
    assert not (tmp_path / "state" / "checkpoints").exists()  # before: the health checks ran first
