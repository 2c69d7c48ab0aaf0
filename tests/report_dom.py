"""Reading the report page back in tests: every ``<table id=...>`` as rows of cell texts."""

from __future__ import annotations

from html.parser import HTMLParser


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("id") or f"#{len(self.tables)}", [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def page_tables(html: str) -> dict[str, list[list[str]]]:
    """``{table id: [[cell text, ...] per row (header row first)]}``; cell texts whitespace-collapsed."""
    parser = _Tables()
    parser.feed(html)
    parser.close()
    return parser.tables


def table_dict(rows: list[list[str]]) -> dict[str, dict[str, str]]:
    """A table keyed by its first column, then by header: ``{row label: {column header: text}}``."""
    header = rows[0]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows[1:]}
