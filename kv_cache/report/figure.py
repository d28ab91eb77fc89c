"""matplotlib set up for files only, and the one way a figure is saved."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from kv_cache.safefiles import write_with


def save(fig, folder: Path, name: str) -> Path:
    fig.tight_layout()
    try:
        return write_with(folder / name, lambda f: fig.savefig(f, dpi=100, format=Path(name).suffix[1:] or "png"),
                          "report", binary=True)
    finally:
        plt.close(fig)
