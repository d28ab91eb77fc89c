"""matplotlib set up for files only, and the one way a figure is saved."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, folder: Path, name: str) -> Path:
    path = folder / name
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
