"""Entry point of the ``kcover`` command: builds the Typer app and maps errors to exit codes.

Exit codes are part of the contract: 0 success (no fatal fault), 1 a fatal
fault or a failed job, 2 a usage error (bad option, bad catalog, missing file).
A user's mistake is reported in one line on stderr, never as a traceback.

Each command lives in its own module, imported only when that command runs
(``kcover --help`` imports them all): a node agent should not carry the
launcher, nor ``kcover explain`` the Kubernetes client.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

from kcover.classify.rules import CatalogError

# command name → (module, function, extra Typer settings)
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "explain": ("kcover.cli.explain_cmd", "explain", {}),
    "run": ("kcover.cli.run_cmd", "run", {"context_settings": {"allow_interspersed_args": False}}),
    "history": ("kcover.cli.history_cmd", "history", {}),
    "demo": ("kcover.cli.demo_cmd", "demo", {}),
    "agent": ("kcover.cli.k8s_cmd", "agent", {}),
    "operator": ("kcover.cli.k8s_cmd", "operator", {}),
    "status": ("kcover.cli.k8s_cmd", "status", {}),
    "check": ("kcover.cli.check_cmd", "check", {}),
    "preflight": ("kcover.cli.check_cmd", "preflight", {}),
}

def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """Fault awareness and instant recovery for distributed AI training."""
    if version:
        from kcover import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


def build_app(names: list[str] | None = None) -> typer.Typer:
    """The Typer app with the named commands (all of them by default), importing only those."""
    app = typer.Typer(
        name="kcover",
        help="Fault awareness and instant recovery for distributed AI training.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback(invoke_without_command=True)(_root)
    for name in names if names is not None else list(COMMANDS):
        module, function, settings = COMMANDS[name]
        app.command(name, **settings)(getattr(importlib.import_module(module), function))
    return app


USAGE_ERROR = 2


def main() -> None:
    """Run the CLI; user mistakes become one line on stderr and exit code 2."""
    wanted = sys.argv[1] if len(sys.argv) > 1 else ""
    app = build_app([wanted] if wanted in COMMANDS else None)
    try:
        app()
    except CatalogError as exc:
        print(f"kcover: invalid catalog: {exc}", file=sys.stderr)
        sys.exit(USAGE_ERROR)
    except KeyboardInterrupt:
        print("kcover: interrupted", file=sys.stderr)
        sys.exit(130)
