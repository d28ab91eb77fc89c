"""Routers: which engine serves a request. One module per router, each naming its class ROUTER; the registry
(run/registry.py) finds them and the fleet is handed that table.

A router is built for one engine count (``ROUTER(engines, slack)``) and answers ``pick(request, engines, now)``:
the index of the engine that serves the request arriving at ``now`` (s). ``needs_conversations``: it keys on a
request's conversation, so traffic without repeated conversations is refused for it. What it reads of an engine:
``load(now)`` (its requests in flight, from the modelled service times) and ``cached_prefix(keys, end)``.
"""
