"""The fleet on paper (`kv_cache_benchmark.py fleet`): N engines, each with its own HBM and CPU tiers, over one
shared KV tier, serving one traffic through a router; what each tier serves and what the shared tier must sustain.

    stream.py    the traffic planned once: each request's blocks, arrival time and conversation
    engines.py   an engine (the benchmark's cache on accounting tiers) and the shared tier they all see
    routers/     one module per router (ROUTER), found by run/registry.discover()
    simulate.py  one (engine count, router): the requests through the router and the engines, in arrival order
    results.py   fleet.json, typed and versioned
    export.py    --export-assignment: each engine's share of a hash-id trace, as a trace of its own

run/fleet_runs.py wires them (the sweep, the output folder, the report); nothing here moves a byte.
"""
