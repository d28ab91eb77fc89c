#!/usr/bin/env python3
"""The MLPerf reference's entry point name, for its tools: `mlpstorage ... kvcache run --kvcache-bin-path
<this repo>/mlperf/kv-cache.py` runs this benchmark. It is kv_cache_benchmark.py: the reference's command lines
are translated there (docs/mlperf.md "The MLPerf front door"). mlperf_wrapper.py and config.yaml beside it are the
other two files mlpstorage looks for next to this one.

mlpstorage runs it with its own interpreter, often a venv of its own without this project's dependencies: then it
runs again under the Python `make install` installed into (recorded in mlperf/.python, or KVBENCH_PYTHON), or says
in one sentence which command installs them (issue 51: it died on `import numpy` and mlpstorage summed zeros)."""

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORD = HERE / ".python"  # written by `make install`: the interpreter the project was installed into
AGAIN = "KVBENCH_REEXEC"  # set on the second start: never a loop between two interpreters


def _ours() -> str:
    """The interpreter the project was installed into, or ''."""
    given = os.environ.get("KVBENCH_PYTHON", "")
    if given:
        return given
    try:
        return RECORD.read_text().strip()
    except OSError:
        return ""


def _missing() -> list[str]:
    return [m for m in ("numpy", "yaml", "hdrh") if importlib.util.find_spec(m) is None]


def _reexec_or_say(missing: list[str]) -> None:
    python = _ours()
    if python and not os.environ.get(AGAIN) and os.access(python, os.X_OK):
        os.environ[AGAIN] = "1"
        os.execv(python, [python, str(Path(__file__).resolve()), *sys.argv[1:]])
    where = f"{python}, the Python recorded for it, does not run it" if python else "no install was recorded"
    said = (f"kv-cache.py: this Python ({sys.executable}) lacks the benchmark's dependencies ({', '.join(missing)}) "
            f"and {where}; run `make install` in {HERE.parent} (it records its Python for this file), or "
            f"`{sys.executable} -m pip install -e {HERE.parent}`.")
    sys.stderr.write(textwrap.fill(said, 100, subsequent_indent="    ", break_on_hyphens=False) + "\n")
    sys.exit(2)


if __name__ == "__main__":
    missing = _missing()
    if missing:
        _reexec_or_say(missing)
    sys.path.insert(0, str(HERE.parent))
    from kv_cache.cli.main import entry

    entry()
