"""The `ddops` command: a Typer app assembled from one module per command group.

Each module in ddops/commands defines `register(app)`; nothing imports this module.
"""

import typer

from ddops.commands import COMMAND_MODULES

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Deploy speculative-decoding LLM servers from hardware profiles.")

for module in COMMAND_MODULES:
    module.register(app)


def main() -> None:
    app()
