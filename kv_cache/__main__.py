from kv_cache import signals
from kv_cache.cli.main import leave, main

signals.install()
leave(main())
