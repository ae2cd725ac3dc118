"""The ``kcover`` command itself: every command is listed, and each runs alone."""

from __future__ import annotations

import subprocess
import sys

from kcover.cli.main import COMMANDS


def kcover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_help_lists_every_command() -> None:
    done = kcover("--help")
    assert done.returncode == 0
    for name in COMMANDS:
        assert f" {name} " in done.stdout


def test_version() -> None:
    from kcover import __version__

    done = kcover("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == __version__


def test_each_command_builds_on_its_own() -> None:
    for name in COMMANDS:
        done = kcover(name, "--help")
        assert done.returncode == 0, (name, done.stderr)
        assert "Usage:" in done.stdout


def test_unknown_command_is_a_usage_error() -> None:
    done = kcover("frobnicate")
    assert done.returncode == 2
    assert "No such command" in done.stderr
