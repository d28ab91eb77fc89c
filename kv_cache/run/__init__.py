"""The composition root: the only code that knows every stage and the concrete tiers. The command line (cli/)
calls it; the MLPerf exporter is a report (report/mlperf/).

    pipeline.py     one run: prepare -> warm-up -> measure -> results -> report; trials
    prepare.py      what can refuse a run, agreed by every rank: traffic, payloads, tiers (build) and close
    progress.py     the dispatcher's tick: gauges, telemetry, the live line
    registry.py     every extension point found once (media, engines, sections, policies, transports), handed down
    geometry.py     the sizes a model's geometry fixes (block, slot, largest object, largest I/O)
    sizing.py       how many workers, and the memory budget of a run of that size
    site.py         the directory under test: checked, its data folder made, the engine that will run there
    stack.py        the tier stack from the registry's media, host memory pinned, GDS, what auto chose
    serving.py      QoS classes, the autoscaler, semantic donor discovery
    traffic.py      which traffic source runs (synthetic, semantic, trace replay) and how it arrives
    checks.py       the options' checks against each other, before anything is built
    handoff.py      the disaggregated roles: which handoff transport, its side per role, its end
    describe.py     what a run says about itself: the banner, the run section of the Results, warnings
    budget.py       the memory budget's parts and the check that they fit
    distributed.py  MPI ranks: agree, broadcast, gather
    trials.py       the median and spread of N trials
    submission.py   MLPerf-style submission rules, package and validation
    policy_runs.py  the `policies` sub-command: one run per eviction policy
    capacity_curve.py  --capacity-curve and the `capacity` sub-command
    outfolder.py    the report folder: reserved before the run, written atomically after
    leftovers.py    markers of running data directories; `clean`

This package is the hub: it wires the stages (sources, scheduler, lifecycle, cache, tiers, recorder, report),
which reach each other only as its arguments; nothing below imports it (docs/architecture.md draws the arrows
tests/unit/test_layering.py enforces).
"""
