"""python -m kv_cache.cli.configdoc config.yaml: every setting, the media's own sections included, written to the
file (atomically: an interrupted run never leaves it empty); without a file, printed.

The composition root writes it because only it knows every medium: importing the tier registry's media
registers their settings sections (config/media.py), then config/doc.py renders the whole schema.
"""

import sys

from kv_cache.config.doc import render
from kv_cache.safefiles import write_file
from kv_cache.tiers.registry import kinds

COMMAND = "python -m kv_cache.cli.configdoc config.yaml"

if __name__ == "__main__":
    kinds()  # every medium's module imported: its settings section registered
    if len(sys.argv) > 1:
        write_file(sys.argv[1], render())
    else:
        print(render(), end="")
