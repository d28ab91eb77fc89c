"""NIXL itself for the handoff: its wheel, the nixl://HOST:PORT form, and an agent with the UCX backend."""

from __future__ import annotations

import os

from kv_cache.errors import UserError

MISSING = ("the NIXL handoff needs NIXL's wheel: pip install --no-deps nixl-cu12 (make install does; its torch "
           "dependency is not needed for host memory)")
SCHEME = "nixl://"
ENGINE = "nixl (UCX)"  # what the results' role section and tier table name
PROGRESS_DELAY_US = 1000  # NIXL's progress thread wakes on UCX's events, and at the latest after this (make_agent)
POLL_S = 0.00005  # a decode worker's pause between polls of its READ


def parse_url(url: str) -> tuple[str, int]:
    """nixl://HOST:PORT -> (host, port), or one sentence."""
    rest = url[len(SCHEME):] if url.startswith(SCHEME) else ""
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--handoff {url}: expected nixl://HOST:PORT (the prefill node's address and a free port), "
                        f"or file://DIR for a shared folder.")
    return host.strip("[]"), int(port)


def nixl_api():
    # NOTE: NIXL's and UCX's own log lines (a peer that reset its connection, a backend's warnings) broke the
    # one-line stderr rule: silenced unless --debug, before the libraries load (they read these once)
    from kv_cache import runlog

    quiet = not runlog.debugging()
    os.environ.setdefault("UCX_LOG_LEVEL", "fatal" if quiet else "warn")
    os.environ.setdefault("NIXL_LOG_LEVEL", "FATAL" if quiet else "WARN")
    try:
        from nixl_cu12 import _api
    except ImportError:
        raise UserError(MISSING + ".") from None
    import logging

    logging.getLogger("nixl").setLevel(logging.CRITICAL if quiet else logging.WARNING)
    return _api


def make_agent(name: str, serves: bool):
    """A NIXL agent with the UCX backend; one that serves READs (a prefill node) with NIXL's progress thread, made to
    sleep between events. A reader's own threads progress its READs while they poll them (a thread beside them
    would contend for the same UCX worker).

    NIXL's Python wrapper fixes that thread's poll delay at 0: it spins a whole core (2.99 CPU-s in 3 s idle,
    measured), which a 2-vCPU node cannot spare. With PROGRESS_DELAY_US the thread sleeps in poll() on UCX's event
    fd and wakes when data arrives (0.09 CPU-s in 3 s idle). It needs no GIL: a prefill node's busy workers do not
    delay the READs it serves, as a Python pump's would. The wrapper has no setting for the delay, so its C++ agent
    is made here with one (the wrapper's `agent`), and the backend then created on it."""
    api = nixl_api()
    try:
        agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=[]))
        if "UCX" not in agent.plugin_list:
            raise UserError("NIXL has no UCX plugin here; the NIXL handoff moves blocks over UCX.")
        conf = api.nixlBind.nixlAgentConfig()
        conf.useProgThread, conf.pthrDelay = serves, PROGRESS_DELAY_US
        conf.syncMode = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT.value  # many workers
        agent.agent = api.nixlBind.nixlAgent(name, conf)
        agent.create_backend("UCX", {})
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - NIXL raises plain exceptions for a missing backend
        raise UserError(f"NIXL could not start its UCX backend ({e}); check that this host's loopback (lo) and the "
                        f"interface to the other node are up, and that UCX_TLS names transports it has (e.g. "
                        f"UCX_TLS=tcp).") from None
    return agent
