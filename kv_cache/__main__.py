from kv_cache import signals
from kv_cache.run.cli import main

signals.install()
status = main()
signals.ignore()  # done: a late signal must not turn the exit into a traceback
raise SystemExit(status)
