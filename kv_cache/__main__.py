from kv_cache.cli import main

raise SystemExit(main())
