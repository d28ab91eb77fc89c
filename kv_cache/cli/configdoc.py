"""python -m kv_cache.cli.configdoc config.yaml: every setting, the media's own sections included, written to the
file (atomically: an interrupted run never leaves it empty); without a file, printed.

An entry point: it discovers the registry (every medium and its settings section) and hands the sections to
config/doc.py, which renders the whole schema.
"""

import sys

from kv_cache.config.doc import render
from kv_cache.run.registry import discover
from kv_cache.safefiles import write_file

COMMAND = "python -m kv_cache.cli.configdoc config.yaml"

if __name__ == "__main__":
    text = render(discover().sections())
    if len(sys.argv) > 1:
        write_file(sys.argv[1], text)
    else:
        print(text, end="")
