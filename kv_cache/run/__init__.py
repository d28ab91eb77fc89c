"""The composition root: the only code that knows every stage and the concrete tiers. The command line (cli/)
calls it; the MLPerf exporter is a report (report/mlperf/).

    pipeline.py     one run: prepare -> warm-up -> measure -> results -> report; trials
    prepare.py      what can refuse a run, agreed by every rank: traffic, payloads, tiers (build) and close
    progress.py     the dispatcher's tick: gauges, telemetry, the live line
    compose.py      settings -> geometry, storage site, tier stack (from the tier registry), memory budget,
                    QoS policy, autoscaler
    traffic.py      which traffic source runs (synthetic, semantic, trace replay) and how it arrives
    checks.py       the options' checks against each other, before anything is built
    handoff.py      the disaggregated roles: which handoff transport, its side per role, its end
    describe.py     what a run says about itself: the banner, the run section of the Results, warnings
    budget.py       the memory budget checked before anything is allocated
    distributed.py  MPI ranks: agree, broadcast, gather
    trials.py       the median and spread of N trials
    submission.py   MLPerf-style submission rules, package and validation
    policies.py     the `policies` sub-command: one run per eviction policy
    capacity.py     --capacity-curve and the `capacity` sub-command
    outfolder.py    the report folder: reserved before the run, written atomically after
    leftovers.py    markers of running data directories; `clean`

The data flows one way below this package (sources -> scheduler -> lifecycle -> cache -> tiers,
recorder beside, report at the end); nothing below imports it.
"""
