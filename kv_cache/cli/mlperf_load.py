"""The MLPerf reference's load model, which its command lines run here unless told otherwise (mlperf.py): all
users at once, one object per request, its RAG and trace defaults, its autoscaler's start and ceiling."""

from __future__ import annotations

import functools

from kv_cache.config import Settings, flag_name, iter_keys
from kv_cache.errors import UserError
from kv_cache.run.traffic import trace_has_times

REFERENCE_USERS_MAX = 500  # the reference's autoscaler clamps its user count here


def load_model(ns, rest: list[str], sets, notes: list[str], default_users: int, timed: bool) -> None:
    """The reference's load model where ours differs, unless the command line set that key itself (with our flag
    or --set) or a reference flag did; one line lists each difference and how to get ours. sets: mlperf.Sets;
    timed: our_trace_timed(rest)."""
    users = ns.num_users if ns.num_users is not None else default_users
    role = sets.get("disagg.role") or typed_value("disagg.role", rest) or "both"
    if role != "both" and not _typed("model.block_tokens", rest):
        notes.append(f"one object per request (the reference's): not applied, a {role} node hands its blocks over "
                     f"through --handoff-dir, each at most --io-chunk-mb; ours: blocks of "
                     f"{Settings().model.block_tokens} tokens (--block-tokens N)")
    closed = not _open_loop(ns, sets, rest, timed)
    model = [  # (key, value, applies, what the reference does, how to get ours)
        ("schedule.admission", "all", closed, "all users start at once", "--admission paced"),
        ("model.block_tokens", 0, role == "both", "one object per request", "--block-tokens 256 for honest blocks"),
        ("rag.num_documents", 10, bool(ns.enable_rag), "10 RAG documents", "--set rag.num_documents=1000"),
        ("trace.replay_cycles", 0, bool(ns.use_burst_trace and not ns.dataset_path),
         "the burst trace looped until --duration", "--replay-cycles 1"),
        ("autoscale.start_users", users, bool(ns.enable_autoscaling), f"the autoscaler starting at {users} users",
         "--set autoscale.start_users=10"),
        ("workload.users", max(users, REFERENCE_USERS_MAX), bool(ns.enable_autoscaling),
         f"no ceiling below its {REFERENCE_USERS_MAX} users", f"--users {users}"),
    ]
    said = []
    for dotted, value, applies, what, ours in model:
        # a key a reference flag or its config set stays (--num-users is the autoscaler's start, not its pool)
        if not applies or _typed(dotted, rest) or (dotted in sets and dotted != "workload.users"):
            continue
        sets.put(dotted, value, f"the MLPerf reference's load model ({what})")
        said.append(f"{what} (ours: {ours})")
    if said:
        notes.insert(0, "the MLPerf reference's load model, not ours: " + "; ".join(said))


def trace_at_its_times(ns, rest: list[str], sets, notes: list[str], timed: bool) -> bool:
    """The burst trace's requests at their timestamps (open loop), or those of a trace our --trace names (timed:
    our_trace_timed(rest)), come from no user: the reference's user count, typed (--num-users, its config) or its
    default, is not applied (ours says --users where no user is made)."""
    at_times = (ns.use_burst_trace and not ns.dataset_path) or timed
    typed = typed_value("schedule.arrival", rest)
    if not (at_times and _open_loop(ns, sets, rest, timed)) or typed not in (None, "auto", "trace"):
        return False
    if "workload.users" in sets:
        origin, users = sets.origin["workload.users"], sets["workload.users"]
        notes.append(f"{origin}: {users} users not applied, the trace's requests come at their timestamps, "
                     f"from no user (--trace-speedup 0 issues them back to back, by users)")
        sets.drop("workload.users")
    return True


def _open_loop(ns, sets, rest: list[str], timed: bool) -> bool:
    """Arrivals that do not wait for answers (a request rate, a trace's timestamps, a sequence): no users to admit.
    The arrival typed with our flag or --set, else a reference flag's, else auto: the burst trace's timestamps, or
    those of a trace our --trace names (every format but ShareGPT has them)."""
    arrival = typed_value("schedule.arrival", rest) or sets.get("schedule.arrival") or "auto"
    if arrival != "auto":
        return arrival != "closed"
    return bool(ns.use_burst_trace and not ns.dataset_path) or timed


def our_trace_timed(rest: list[str]) -> bool:
    """Our --trace beside the reference's flags names a trace with timestamps (its format typed or detected: its
    files' first lines read, once a command line)."""
    path = typed_value("trace.path", rest)
    if not path:
        return False
    try:
        return trace_has_times(path, typed_value("trace.format", rest) or "auto")
    except UserError:
        return False  # loading the trace says what is wrong with it, in the run


def value_of(argv: list[str], flag: str) -> str | None:
    """The value a command line gives flag (--flag V or --flag=V); None where it is not there."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


@functools.cache
def _fields() -> dict:
    return {d: f for d, f, _ in iter_keys(Settings)}


def our_flag(dotted: str) -> str | None:
    """Our flag for a setting (None: a key with no flag of its own, set with --set only)."""
    f = _fields().get(dotted)
    return flag_name(dotted, f) if f is not None else None


def typed_value(dotted: str, rest: list[str]) -> str | None:
    """The value the command line gives dotted with our own flag or --set (a --set value's quotes dropped)."""
    flag = our_flag(dotted)
    value = value_of(rest, flag) if flag else None
    if value is not None:
        return value
    sets = [a.split("=", 1)[1] for i, a in enumerate(rest[1:], 1) if rest[i - 1] == "--set"
            and a.split("=", 1)[0] == dotted and "=" in a]
    return sets[-1].strip("'\"") if sets else None


def _typed(dotted: str, rest: list[str]) -> bool:
    """Did the command line set this key with our own flag or --set?"""
    flag = our_flag(dotted)
    return any(a == flag or (flag and a.startswith(flag + "=")) or a.split("=")[0] == dotted for a in rest)
