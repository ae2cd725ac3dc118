"""Entry point of the ``kcover`` command: builds the Typer app and maps errors to exit codes.

Exit codes are part of the contract: 0 success (no fatal fault), 1 a fatal
fault or a failed job, 2 a usage error (bad option or value, bad catalog,
missing file), 74 results that could not be written to stdout, 141 a closed
pipe on stdout (quietly, as a tool killed by SIGPIPE).  A user's mistake is
reported in one line on stderr, never as a traceback; with ``--json`` stdout
also carries one error object (:mod:`kcover.cli.usage`).  The app runs in
Click's non-standalone mode so that every error passes through here, and over
guarded stdout and stderr (:mod:`kcover.cli.streams`).

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
from kcover.cli import streams
from kcover.cli.usage import (
    Abort,
    ClickException,
    ClickUsageError,
    NoArgsIsHelpError,
    UsageError,
    error_document,
    one_line,
    wants_json,
)
from kcover.collect.printable import printable
from kcover.exit_codes import ExitCode

# command name → (module, function, extra Typer settings)
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "explain": ("kcover.cli.explain_cmd", "explain", {}),
    "run": ("kcover.cli.run_cmd", "run", {"context_settings": {"allow_interspersed_args": False}}),
    "pod": ("kcover.cli.pod_cmd", "pod", {"context_settings": {"allow_interspersed_args": False}}),
    "history": ("kcover.cli.history_cmd", "history", {}),
    "report": ("kcover.cli.report_cmd", "report", {}),
    "demo": ("kcover.cli.demo_cmd", "demo", {}),
    "agent": ("kcover.cli.k8s_cmd", "agent", {}),
    "operator": ("kcover.cli.k8s_cmd", "operator", {}),
    "status": ("kcover.cli.k8s_cmd", "status", {}),
    "inject": ("kcover.cli.inject_cmd", "inject", {}),
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
        raise typer.Exit(ExitCode.SUCCESS)


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


def main() -> None:
    """Run the CLI; user mistakes become one line on stderr and exit code 2."""
    streams.install()
    argv = sys.argv[1:]
    wanted = argv[0] if argv else ""
    try:
        code = _invoke(build_app([wanted] if wanted in COMMANDS else None), argv)
        sys.stdout.flush()
    except streams.OutputError as error:
        code = ExitCode.CLOSED_PIPE if error.closed_pipe else _report_output_error(error)
    except KeyboardInterrupt:
        print("kcover: interrupted", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    sys.exit(int(code))


def _invoke(app: typer.Typer, argv: list[str]) -> int:
    """Run the app in non-standalone mode and map what it raises to an exit code."""
    try:
        code = app(args=argv, prog_name="kcover", standalone_mode=False)
    except NoArgsIsHelpError as error:
        typer.echo(error.ctx.get_help() if error.ctx else error.format_message())
        return ExitCode.USAGE
    except ClickException as error:
        return _usage_error(error, argv)
    except CatalogError as error:
        return _usage_error(UsageError(f"invalid catalog: {error}"), argv)
    except Abort:
        print("kcover: aborted", file=sys.stderr)
        return ExitCode.FAILED
    code = code if isinstance(code, int) else ExitCode.SUCCESS
    if code == ExitCode.USAGE and wants_json(argv) and not streams.stdout_used():
        typer.echo(error_document(streams.last_stderr_line().removeprefix("kcover: ")))
    return code


def _usage_error(error: ClickException, argv: list[str]) -> int:
    """One line on stderr; with ``--json`` also the error object on stdout."""
    message = printable(one_line(error.format_message()))  # it may quote a path or a value from outside
    if isinstance(error, ClickUsageError) and not isinstance(error, UsageError) and argv[:1] != ["--help"]:
        command = f"kcover {argv[0]}" if argv and argv[0] in COMMANDS else "kcover"
        message += f" (see {command} --help)"
    print(f"kcover: {message}", file=sys.stderr)
    if wants_json(argv):
        typer.echo(error_document(message))
    return error.exit_code


def _report_output_error(error: streams.OutputError) -> int:
    print(f"kcover: cannot write the output to stdout: {error}", file=sys.stderr)
    return ExitCode.OUTPUT_ERROR
