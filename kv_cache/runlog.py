"""Where a maintainer finds what broke: the run's log file, and internal errors said in one line.

A user's mistake is a UserError (one sentence, exit 2). A bug in our code is not: its traceback is kept in a
log file and the user is told, in one line, what failed and which file holds the traceback (exit 1);
``--debug`` prints the traceback on stderr too. A run logs into ``<output-dir>/<run-id>/run.log``; a command
without a run folder (report, compare) into a fresh file in the system's temporary directory. The file is
created on the first record only: a run without a problem writes no log.

A shared leaf: any stage may import it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

LOG = logging.getLogger("kv_cache")
LOG.propagate = False  # never to the root logger's stderr handler: the user sees our one line instead
LOG.setLevel(logging.INFO)
FORMAT = "%(asctime)s %(threadName)s %(levelname)s %(message)s"


class _State:
    path: Path | None = None
    handler: logging.Handler | None = None
    debug = False


_state = _State()


def set_debug(on: bool) -> None:
    """--debug: tracebacks of internal errors go to stderr as well as to the log."""
    _state.debug = on


def debugging() -> bool:
    return _state.debug


def open_log(path: Path) -> None:
    """Log into path from now on (created on the first record)."""
    close()
    handler = logging.FileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    LOG.addHandler(handler)
    _state.path, _state.handler = Path(path), handler


def close() -> None:
    if _state.handler is not None:
        LOG.removeHandler(_state.handler)
        _state.handler.close()
    _state.path = _state.handler = None


def where() -> Path:
    """The log file, made in the temporary directory when no run opened one."""
    if _state.path is None:
        fd, name = tempfile.mkstemp(prefix="kvbench-", suffix=".log")
        os.close(fd)
        open_log(Path(name))
    return _state.path


def internal(context: str, exc: BaseException) -> str:
    """Keep exc's traceback in the log (once per exception) and return the line for the user:
    '<context>: <Type>: <message> (traceback in <log>)'."""
    path = where()
    if not getattr(exc, "_kvbench_logged", False):
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        LOG.error("%s\n%s", context, text.rstrip())
        for h in LOG.handlers:
            h.flush()
        if _state.debug:
            sys.stderr.write(text)
        try:
            exc._kvbench_logged = True
        except AttributeError:  # an exception type without a __dict__: logged again if met again
            pass
    return f"{context}: {type(exc).__name__}: {exc} (traceback in {path})"


class PipeSafe:
    """stdout that outlives its reader: `... | head` closed the pipe and the run ended as an internal error
    (BrokenPipeError) with its results unwritten. Once the reader is gone the run goes on, printing nowhere."""

    def __init__(self, stream):
        self._stream, self.gone = stream, False

    def _closed(self) -> None:
        self.gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's own flush at exit must not fail either
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed()

    def __getattr__(self, name):
        return getattr(self._stream, name)


COLUMNS = 100  # what a person reads: an error wraps at the console's width, as the summary does
PROG = "kv_cache_benchmark.py"


def tell(text: str) -> None:
    """One sentence for the user on stderr, prefixed with the program's name, wrapped at COLUMNS (continuation
    lines indented by four: one sentence, however long its numbers make it; a path longer than a line stays
    whole)."""
    import textwrap

    print(textwrap.fill(f"{PROG}: {text}", COLUMNS, subsequent_indent="    ", break_long_words=False,
                        break_on_hyphens=False), file=sys.stderr, flush=True)
