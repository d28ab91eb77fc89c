#!/usr/bin/env python3
"""Entry point: python kv_cache_benchmark.py --model llama70b --users 200"""

from kv_cache import signals

signals.install()  # before the heavy imports: a SIGTERM during start-up is a clean exit too

try:
    from kv_cache.cli.main import leave, main
except KeyboardInterrupt:
    raise SystemExit(signals.exit_status()) from None

if __name__ == "__main__":
    leave(main())
