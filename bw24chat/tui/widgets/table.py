"""Filling a DataTable in one go, with column widths measured here.

DataTable measures new rows when it next idles, and a frame drawn before that keeps the
narrow header-width columns in its render cache (seen as truncated cells, now and then);
giving every column its width up front avoids the race altogether.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable


def fill_table(table: DataTable, columns: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]) -> None:
    """Replace the table's columns and rows; ``rows`` are (key, cells)."""
    rows = list(rows)
    widths = [max([cell_len(label)] + [cell_len(cells[i]) for _, cells in rows]) for i, label in enumerate(columns)]
    table.clear(columns=True)
    for label, width in zip(columns, widths):
        table.add_column(label, width=width)
    for key, cells in rows:
        table.add_row(*(Text(cell) for cell in cells), key=key)  # plain text: a str cell is parsed as markup
