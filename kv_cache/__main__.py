from kv_cache import signals
from kv_cache.run.cli import leave, main

signals.install()
leave(main())
