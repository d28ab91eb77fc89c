"""python -m kv_cache.cli.configdoc > config.yaml: every setting, the media's own sections included.

The composition root writes it because only it knows every medium: importing the tier registry's media
registers their settings sections (config/media.py), then config/doc.py renders the whole schema.
"""

from kv_cache.config.doc import render
from kv_cache.tiers.registry import kinds

if __name__ == "__main__":
    kinds()  # every medium's module imported: its settings section registered
    print(render(), end="")
