"""The fault matrix's fast scenarios (issue 15), run short: steady streamed and non-streamed load through
real gateways, a fault injected, every request counted. Target: 0 lost, the gateway and the healthy
replicas still up, and the load back to all answered. The whole matrix, longer, with its table:
`python bench/reliability/fault_matrix.py` (RELIABILITY.md)."""

from __future__ import annotations

import pytest

from tests import fault_scenarios, replica_faults
from tests.load_counter import HEADER, Tally

pytestmark = pytest.mark.timeout(300)


def check(tally: Tally) -> None:
    print(f"\n{HEADER}\n{tally.row()}\n{dict(tally.details())}")
    assert tally.lost == 0, dict(tally.details())
    assert tally.count("answered") > 0 and tally.survivors_up
    assert tally.recovery_s() is not None, "the load never got back to all answered"


@pytest.mark.parametrize("behaviour", ["silent", "garbage", "close_headers", "trickle"])
def test_upstream_that_goes_bad(behaviour):
    tally = fault_scenarios.upstream_goes_bad(behaviour, seconds=5)
    check(tally)
    if behaviour in ("silent", "trickle"):  # waited out by the first-byte timeout: 504 with Retry-After
        assert any("504 upstream_timeout" in k for k in tally.details()), dict(tally.details())


def test_redis_killed_and_restarted_under_two_gateways():
    check(fault_scenarios.redis_restarted_under_two_gateways(seconds=4))


def test_ten_times_capacity():
    tally = fault_scenarios.ten_times_capacity(seconds=5)
    check(tally)
    assert tally.count("refused") > 0 and all(k.startswith("refused: 503") for k in tally.details())


@pytest.fixture(scope="module")
def pair(tiny_llama):
    p = replica_faults.ReplicaPair(tiny_llama)
    yield p
    p.stop()


def test_replica_frozen_then_resumed(pair):
    check(replica_faults.replica_frozen(pair, frozen_s=5, seconds=5))


def test_replica_killed_mid_stream(pair):
    check(replica_faults.replica_killed(pair, "mid-stream", seconds=5))
