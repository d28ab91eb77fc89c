"""Plain-text tables: first columns left-aligned (names), the rest right-aligned (numbers)."""

from __future__ import annotations

import re
import textwrap

from kv_cache.recorder.histogram import PCT_KEYS, PERCENTILES, supported


def ms(v) -> str:
    """A latency in ms: 3 decimals below 10, 1 above; '-' when there is none."""
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def format_table(rows: list[list[str]], text_columns: int = 2, indent: str = "") -> list[str]:
    """Lines of a table whose first row is the header, underlined."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return [indent + line.rstrip() for line in lines]


PERCENTILE_OF = dict(zip(PCT_KEYS, PERCENTILES))  # "p999" -> 99.9


def pct_ms(summary, key: str) -> str:
    """One percentile of a Latency summary in ms, or '-' from too few samples to support it."""
    if summary is None or getattr(summary, key) is None or not supported(PERCENTILE_OF[key], summary.count):
        return "-"
    return ms(getattr(summary, key))


WIDTH = 100  # the console's columns: every line the run prints fits them


def fit(text: str, width: int = WIDTH) -> str:
    """text with each line longer than width wrapped at spaces: continuation lines start under the line's text
    (after a label column such as "Tokens     ", or its indentation + 4). A word longer than the width (a path)
    stays whole."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        label = re.match(r"(\s*\S+(?: \S+)?\s{2,})\S", line[:40])
        indent = " " * (len(label.group(1)) if label else len(line) - len(line.lstrip()) + 4)
        out.append(textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False))
    return "\n".join(out)
