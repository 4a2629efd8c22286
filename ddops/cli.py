"""The `ddops` command: a Typer app assembled from one module per command group.

Each module in ddops/commands defines `register(app)`; nothing imports this module. Global
options (`--debug`, `--version`, shell completion) live here, and every command runs inside
`ddops.shell.guard`, the one place an exception that escapes a command becomes an exit code.
The SSH library's own log lines (paramiko reports banner errors, resets and EOFs itself) stay
off stderr unless `--debug`: the command reports a lost connection once, as exit 3. `--debug`
also prints what each SSH connection cost (commands, file operations, seconds) when it closes.
"""

import logging

from typing import Optional

import typer

from ddops import __version__, shell
from ddops.commands import COMMAND_MODULES

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  help="Deploy speculative-decoding LLM servers from hardware profiles.")


def _version(value: bool) -> None:
    if value:
        print(f"ddops {__version__}")
        raise typer.Exit(0)


@app.callback()
def global_options(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of unexpected errors."),
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Deploy speculative-decoding LLM servers from hardware profiles."""
    shell.OPTIONS.debug = debug
    shell.OPTIONS.events = False
    quiet_ssh_logs(not debug)


def quiet_ssh_logs(quiet: bool) -> None:
    logger = logging.getLogger("paramiko")
    logger.propagate = not quiet
    logger.handlers = [logging.NullHandler()] if quiet else []
    ours = logging.getLogger("ddops")
    ours.setLevel(logging.WARNING if quiet else logging.DEBUG)
    ours.handlers = [] if quiet else [_stderr_handler()]
    ours.propagate = quiet


def _stderr_handler() -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("debug: %(message)s"))
    return handler


def _guard_all(typer_app: typer.Typer) -> None:
    """Every command, in every group, runs inside shell.guard; every one with --json gets --json-events."""
    for command in typer_app.registered_commands:
        command.callback = shell.guard(shell.with_events(command.callback))
    for group in typer_app.registered_groups:
        _guard_all(group.typer_instance)


for module in COMMAND_MODULES:
    module.register(app)
_guard_all(app)


def main() -> None:
    quiet_ssh_logs(True)
    app()
