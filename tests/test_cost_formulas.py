"""The cost formulas against hand-computed cases (the arithmetic is written beside each expectation)."""

import math

import pytest

from argosy.cost import formulas as f


def test_period_hours():
    assert f.PERIOD_HOURS["week"] == 168  # 7 x 24
    assert f.PERIOD_HOURS["month"] == 730  # 8760 / 12


def test_blended_gpu_hour():
    # 0.25 x $3.00 + 0.75 x $2.00 = 0.75 + 1.50 = $2.25
    assert f.blended_gpu_hour({"on_demand": 3.0, "reserved": 2.0}, {"on_demand": 0.25, "reserved": 0.75}) == \
        pytest.approx(2.25)
    # a tier with no share needs no price
    assert f.blended_gpu_hour({"spot": 1.5}, {"spot": 1.0, "reserved": 0.0}) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="sum to 1"):
        f.blended_gpu_hour({"on_demand": 3.0}, {"on_demand": 0.5})


def test_token_split_and_price_per_mtok():
    # 1000 input, 250 output weighted 4x: 1000 / (1000 + 1000) = 0.5
    assert f.default_input_share(1000, 250) == pytest.approx(0.5)
    # 3000 input, 1000 output weighted 1x: 3000 / 4000
    assert f.default_input_share(3000, 1000, output_weight=1.0) == pytest.approx(0.75)
    assert f.default_input_share(0, 0) == 0.5  # nothing served: no division by zero
    # $100 of GPU time, 30 % on input: $30 and $70
    assert f.split_cost(100.0, 0.3) == pytest.approx((30.0, 70.0))
    with pytest.raises(ValueError):
        f.split_cost(100.0, 1.2)
    # $5 over 2,000,000 tokens = $2.50 per million
    assert f.usd_per_mtok(5.0, 2_000_000) == pytest.approx(2.5)
    assert f.usd_per_mtok(5.0, 0) is None


def test_overhead_lines():
    # 0.5 FTE x $200,000/year x 730 h / 8760 h = $8,333.33
    assert f.engineering_usd(0.5, 200_000, 730) == pytest.approx(8333.333, abs=1e-3)
    # (3 nodes x $15 + $100) per month, for a week: 145 x 168 / 730 = $33.37
    assert f.monitoring_usd(3, 15, 100, 168) == pytest.approx(33.3699, abs=1e-4)
    # $1,000/month for a week: 1000 x 168 / 730 = $230.14
    assert f.operations_usd(1000, 168) == pytest.approx(230.137, abs=1e-3)
    assert f.nodes_for(16, 8) == 2
    assert f.nodes_for(16.5, 8) == 3
    assert f.nodes_for(0.2, 8) == 1
    assert f.nodes_for(0, 8) == 0
    # 2M input at $1/Mtok + 0.5M output at $3/Mtok = 2 + 1.5 = $3.50
    assert f.api_usd(2_000_000, 500_000, 1.0, 3.0) == pytest.approx(3.5)


def test_break_even_staircase():
    # F = $250 fixed, p = $100 per replica, cap = 1M tokens per replica, API a = $200/Mtok = 2e-4 $/token.
    # margin m = 1e6 x 2e-4 - 100 = $100. n1 = ceil(250 / 100) = 3: V1 = (250 + 300) / 2e-4 = 2.75M tokens.
    # k = ceil((250 + 100) / 100) = 4: Vk = (250 + 400) / 2e-4 = 3.25M tokens.
    be = f.break_even(250.0, 100.0, 1e6, 2e-4)
    assert be.first_replicas == 3 and be.first_tokens == pytest.approx(2.75e6)
    assert be.all_replicas == 4 and be.all_tokens == pytest.approx(3.25e6)

    def self_hosted(v: float) -> float:  # F + ceil(V / cap) x p
        return 250 + math.ceil(v / 1e6) * 100

    # Check the claims against the staircase directly: dearer just below V1, cheaper at V1, dearer
    # again once a 4th replica is needed (3.1M tokens: $650 against the API's $620), never dearer from Vk.
    assert self_hosted(2.7e6) > 2.7e6 * 2e-4
    assert self_hosted(2.75e6) <= 2.75e6 * 2e-4
    assert self_hosted(3.1e6) > 3.1e6 * 2e-4
    assert all(self_hosted(v) <= v * 2e-4 for v in (3.25e6, 3.6e6, 4.0e6, 4.01e6, 7.5e6, 1e8))


def test_break_even_without_fixed_costs():
    # F = 0: one replica pays off at p / a = 100 / 2e-4 = 500k tokens, and stays cheaper (k = ceil(100/100) = 1).
    be = f.break_even(0.0, 100.0, 1e6, 2e-4)
    assert (be.first_replicas, be.first_tokens) == (1, pytest.approx(5e5))
    assert (be.all_replicas, be.all_tokens) == (1, pytest.approx(5e5))


@pytest.mark.parametrize("api_usd_per_token", [1e-4, 5e-5, 0.0])
def test_break_even_when_the_api_is_always_cheaper(api_usd_per_token):
    # A full replica's 1M tokens cost $100 self-hosted; the API sells them for $100, $50 or nothing.
    be = f.break_even(250.0, 100.0, 1e6, api_usd_per_token)
    assert be.first_tokens is None and be.all_tokens is None and be.first_replicas is None
    assert "cheaper at every volume" in be.reason
    assert "$100.000/Mtok" in be.reason  # 100 / 1e6 x 1e6


def test_break_even_without_throughput():
    be = f.break_even(250.0, 100.0, 0.0, 2e-4)
    assert be.first_tokens is None and "throughput" in be.reason
