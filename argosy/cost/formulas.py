"""The cost formulas, pure arithmetic (docs/cost.md derives each one).

Money is US dollars, time hours, volumes tokens. Nothing here reads files or prices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730 h: a month is a twelfth of a year, as cloud bills count it
PERIOD_HOURS = {"week": 168.0, "month": HOURS_PER_MONTH}
# Without a measured split, an output token is charged this many input tokens' worth of GPU time: a
# convention (hosted APIs price output at about 1-5x input), not a measurement. `argosy sim` measures it.
OUTPUT_TOKEN_WEIGHT = 4.0


def blended_gpu_hour(prices: Mapping[str, float], mix: Mapping[str, float]) -> float:
    """$ per GPU-hour of a tier mix: sum of share x price; the shares must sum to 1."""
    if any(s < 0 for s in mix.values()) or not math.isclose(sum(mix.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"tier shares must be >= 0 and sum to 1, got {dict(mix)}")
    return sum(share * prices[tier] for tier, share in mix.items() if share > 0)


def default_input_share(input_tokens: float, output_tokens: float,
                        output_weight: float = OUTPUT_TOKEN_WEIGHT) -> float:
    """Share of GPU time put on input tokens when no measured split is given."""
    weighted = input_tokens + output_weight * output_tokens
    return input_tokens / weighted if weighted > 0 else 0.5


def usd_per_mtok(cost_usd: float, tokens: float) -> float | None:
    """$ per million tokens; None when there are no tokens to divide by."""
    return cost_usd / tokens * 1e6 if tokens > 0 else None


def split_cost(cost_usd: float, input_share: float) -> tuple[float, float]:
    """The GPU cost put on input tokens and on output tokens."""
    if not 0.0 <= input_share <= 1.0:
        raise ValueError(f"input share must be in [0, 1], got {input_share}")
    return cost_usd * input_share, cost_usd * (1.0 - input_share)


def engineering_usd(fte: float, loaded_annual_salary_usd: float, hours: float) -> float:
    return fte * loaded_annual_salary_usd * hours / HOURS_PER_YEAR


def monitoring_usd(nodes: int, usd_per_node_month: float, fixed_usd_month: float, hours: float) -> float:
    return (nodes * usd_per_node_month + fixed_usd_month) * hours / HOURS_PER_MONTH


def operations_usd(usd_month: float, hours: float) -> float:
    return usd_month * hours / HOURS_PER_MONTH


def nodes_for(gpus: float, gpus_per_node: int) -> int:
    return math.ceil(gpus / gpus_per_node - 1e-9) if gpus > 0 else 0


def api_usd(input_tokens: float, output_tokens: float, input_usd_per_mtok: float, output_usd_per_mtok: float) -> float:
    return (input_tokens * input_usd_per_mtok + output_tokens * output_usd_per_mtok) / 1e6


@dataclass(frozen=True)
class BreakEven:
    """Volumes (tokens in the period) at which self-hosting costs no more than the API.

    first_tokens: the lowest such volume; above it the two may still swap back for a while, each time a
    replica is added (self-hosting's cost is a staircase, the API's a line). all_tokens: from this
    volume on self-hosting is never dearer. None (both) when the API is cheaper at every volume.
    """
    first_tokens: float | None
    first_replicas: int | None
    all_tokens: float | None
    all_replicas: int | None
    reason: str = ""


def break_even(fixed_usd: float, replica_usd: float, replica_tokens: float, api_usd_per_token: float) -> BreakEven:
    """Self-hosting costs F + n*p for volumes in ((n-1)*cap, n*cap]; the API costs V * a.

    F = fixed_usd (the period's fixed lines), p = replica_usd (one replica's cost over the period),
    cap = replica_tokens (what one replica serves in the period, fully busy), a = api_usd_per_token.
    With margin m = cap*a - p (what a full replica saves), the first crossing is in replica count
    n1 = max(1, ceil(F/m)) at V1 = (F + n1*p)/a; the last swap back ends in k = ceil((F+p)/m) at
    Vk = (F + k*p)/a. No crossing when m <= 0: the API is cheaper even for a fully busy replica.
    """
    if replica_tokens <= 0:
        return BreakEven(None, None, None, None, "no measured throughput: cannot size replicas")
    margin = replica_tokens * api_usd_per_token - replica_usd
    if margin <= 0:
        return BreakEven(None, None, None, None,
                         f"the API is cheaper at every volume: even fully busy, a replica's tokens cost "
                         f"${replica_usd / replica_tokens * 1e6:,.3f}/Mtok, the API's "
                         f"${api_usd_per_token * 1e6:,.3f}/Mtok")
    n_first = max(1, math.ceil(fixed_usd / margin))
    n_all = max(1, math.ceil((fixed_usd + replica_usd) / margin))
    return BreakEven((fixed_usd + n_first * replica_usd) / api_usd_per_token, n_first,
                     (fixed_usd + n_all * replica_usd) / api_usd_per_token, n_all)
