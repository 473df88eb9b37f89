"""Reading the markdown tables the reports print, for the tests."""

from __future__ import annotations


def tables(text: str) -> list[list[dict]]:
    """The markdown tables of ``text``: per table, one ``{header: cell}`` per row."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith(("|:", "|-")):
            names = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(names, (c.strip() for c in row.strip("|").split("|")))))
            out.append(rows)
    return out
