"""argparse, answering a mistake in one sentence.

argparse prints its 13-26-line usage block before the one line that says what was wrong, and exits by itself.
Here a parse error is a UserError like every other bad input: one line, the flag at fault, where to look
(--help), exit 2.
"""

from __future__ import annotations

import argparse
import math

from kv_cache.errors import UserError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UserErrors (one sentence, no usage block)."""

    def error(self, message: str):
        raise UserError(f"{message}; see {self.prog} --help.")


def amount(text: str) -> float:
    """A finite number >= 0: NaN passes every comparison and would reach the arithmetic of a size."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
