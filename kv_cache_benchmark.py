#!/usr/bin/env python3
"""Entry point: python kv_cache_benchmark.py --model llama70b --users 200"""

from kv_cache.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
