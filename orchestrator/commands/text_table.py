"""A table as plain text in aligned columns, for listings that may run to thousands of rows.

`rich` measures the markup of every cell: at a thousand running jobs `orchestrator queue` took
seconds to lay its table out. This pads each column to its widest cell, colours a cell only on
a terminal, and cuts the last column at the line's width.
"""

from __future__ import annotations

from collections.abc import Sequence

COLORS = {"cyan": "36", "yellow": "33", "green": "32", "red": "31", "white": "37"}
Cell = str | tuple[str, str]  # text, or (text, colour name)


def render(headers: Sequence[str], rows: Sequence[Sequence[Cell]], width: int, tty: bool) -> str:
    """The table, header first; two spaces between columns, the last one cut to `width`."""
    texts = [[_text(cell) for cell in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in texts]) for i, h in enumerate(headers)]
    lines = [_line([_bold(h, tty) for h in headers], list(headers), widths, width)]
    for row, text in zip(rows, texts):
        shown = [_painted(cell, tty) for cell in row]
        lines.append(_line(shown, text, widths, width))
    return "\n".join(lines)


def _line(shown: list[str], text: list[str], widths: list[int], width: int) -> str:
    parts = [s + " " * (w - len(t)) for s, t, w in zip(shown[:-1], text[:-1], widths)]
    used = sum(w + 2 for w in widths[:-1])
    last = text[-1] if len(text[-1]) <= max(width - used, 1) else text[-1][: max(width - used - 1, 0)] + "…"
    return "  ".join(parts + [last if last != text[-1] else shown[-1]]).rstrip()


def _text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0]


def _painted(cell: Cell, tty: bool) -> str:
    if isinstance(cell, str) or not tty:
        return _text(cell)
    text, color = cell
    return f"\033[{COLORS.get(color, '37')}m{text}\033[0m"


def _bold(text: str, tty: bool) -> str:
    return f"\033[1m{text}\033[0m" if tty else text
