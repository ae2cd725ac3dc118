"""Entry point of the ``kcover`` command: builds the Typer app and maps errors to exit codes.

Exit codes are part of the contract: 0 success (no fatal fault), 1 a fatal
fault or a failed job, 2 a usage error (bad option, bad catalog, missing file).
A user's mistake is reported in one line on stderr, never as a traceback.
"""

from __future__ import annotations

import sys

import typer

from kcover.classify.rules import CatalogError
from kcover.cli import demo_cmd, explain_cmd, history_cmd, k8s_cmd, run_cmd
from kcover.health import cli as health_cli

app = typer.Typer(
    name="kcover",
    help="Fault awareness and instant recovery for distributed AI training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("explain")(explain_cmd.explain)
app.command("run", context_settings={"allow_interspersed_args": False})(run_cmd.run)
app.command("history")(history_cmd.history)
app.command("demo")(demo_cmd.demo)
app.command("agent")(k8s_cmd.agent)
app.command("operator")(k8s_cmd.operator)
app.command("status")(k8s_cmd.status)
app.command("check")(health_cli.check)
app.command("preflight")(health_cli.preflight)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """Fault awareness and instant recovery for distributed AI training."""
    if version:
        from kcover import __version__

        typer.echo(__version__)
        raise typer.Exit(0)

USAGE_ERROR = 2


def main() -> None:
    """Run the CLI; user mistakes become one line on stderr and exit code 2."""
    try:
        app()
    except CatalogError as exc:
        print(f"kcover: invalid catalog: {exc}", file=sys.stderr)
        sys.exit(USAGE_ERROR)
    except KeyboardInterrupt:
        print("kcover: interrupted", file=sys.stderr)
        sys.exit(130)
