"""The command line: an entry point beside the composition root (run/), which it calls.

    main.py           the sub-commands (run, report, compare, policies, validate, clean, capacity) and their flags
    flags.py args.py  every setting's flag, grouped by task for --help; argparse answering in one sentence
    mlperf.py         the MLPerf reference's command lines translated (mlperf_config.py: its config.yaml;
                      mlperf_load.py: its load model; mlperf_files.py: its files, checked before and made after)
    lmcache.py        an LMCache configuration translated
    configdoc.py      python -m kv_cache.cli.configdoc config.yaml

Nothing below imports it: the entry points (kv_cache_benchmark.py, python -m kv_cache, mlperf/kv-cache.py) do.
"""
