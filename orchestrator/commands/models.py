"""`orchestrator models`: every model family and preset, with size and cost."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def register(sub) -> None:
    parser = sub.add_parser("models", help="list model families and presets")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from workers import models

    table = Table(title="Models (forward FLOPs for one sample at the default input)")
    for column, justify in [
        ("family", "left"),
        ("preset", "left"),
        ("parameters", "right"),
        ("forward FLOPs", "right"),
        ("default input", "left"),
    ]:
        table.add_column(column, justify=justify)
    for row in models.catalog():
        table.add_row(
            row["family"],
            row["preset"],
            f"{row['params']:,}",
            f"{row['forward_flops'] / 1e9:,.2f} G",
            row["input"],
        )
    Console().print(table)
    return 0
