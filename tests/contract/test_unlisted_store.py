"""A store that cannot list its keys plugs in (issue 40, item 3): the tier's own key index removes what the run
wrote, and `clean` says it cannot find a killed run's objects rather than pretending there are none. A real Valkey
server, its SCAN withheld (remote.Unlisted)."""

import numpy as np
from found import REGISTRY
from servers import valkey_keys

from kv_cache.markers import Swept
from kv_cache.tiers import remote

SLOT = 64 * 1024


def unlisted_tier(valkey_server, tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    return REGISTRY.media.by_name()["valkey"].make_for_test("unlisted", str(d), 8 * SLOT, SLOT, valkey_server,
                                                        REGISTRY.engines)


def test_the_tiers_own_index_removes_every_object_the_run_wrote(valkey_server, tmp_path):
    tier = unlisted_tier(valkey_server, tmp_path, "a")
    assert not isinstance(tier.store, remote.Listing)
    pattern = f"{remote.NAMESPACE}{tier.run_id}:*"
    for key in range(1, 6):
        tier.put(key, np.full(SLOT - key, key, np.uint8))  # objects of several sizes
    tier.delete(3)
    assert len(valkey_keys(valkey_server.url, pattern)) == 5  # four blocks and the marker
    tier.close()
    assert valkey_keys(valkey_server.url, pattern) == []


def test_a_killed_runs_objects_are_not_found_and_clean_says_why(valkey_server, tmp_path):
    tier = unlisted_tier(valkey_server, tmp_path, "b")
    tier.put(7, np.ones(SLOT, np.uint8))  # killed here: no close
    pattern = f"{remote.NAMESPACE}{tier.run_id}:*"
    said: list[str] = []
    assert remote.dead_namespaces(tier.store) == []
    assert remote.clean_namespaces(tier.store, True, False, said.append) == Swept()
    assert said and "cannot list its keys" in said[0] and "eviction" in said[0]
    assert len(valkey_keys(valkey_server.url, pattern)) == 2  # nothing was removed blindly
    tier.close()  # the test's own cleanup: its index still knows the block
    assert valkey_keys(valkey_server.url, pattern) == []
