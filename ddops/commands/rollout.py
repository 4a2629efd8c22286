import typer


def register(app: typer.Typer) -> None:
    """Commands of this group are added here when the group lands."""
