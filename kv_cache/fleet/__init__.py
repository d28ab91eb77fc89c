"""The fleet on paper (`kv_cache_benchmark.py fleet`): N engines, each with its own HBM and CPU tiers, over one
shared KV tier, serving one traffic through a router; what each tier serves and what the shared tier must sustain.

    stream.py    the traffic planned once: each request's blocks, arrival time and conversation
    engines.py   an engine (the benchmark's cache on accounting tiers), the shared tier of --shared-writes demote
    through.py   --shared-writes through: engines that store every block as made, the shared tier one LRU pool
    stack.py     --engine-model stack: an engine's tiers as the LRU waterfall alone (two ordered maps)
    shared_log.py  the shared tier's access stream, sampled as recorded past 4 M blocks: its capacity curve
    memory.py    whether a fleet fits, checked before it grows
    routers/     one module per router (ROUTER), found by run/registry.discover()
    simulate.py  one (engine count, router): the requests through the router and the engines, in arrival order
    results.py   fleet.json, typed and versioned

run/fleet_runs.py wires them (the sweep, the output folder, the report); nothing here moves a byte.
"""
