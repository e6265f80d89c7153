"""Gateway building blocks in isolation: prefix index, routing policies, admission, keys, limits, guardrails."""

import asyncio
import time

import pytest

from argosy.config import AdmissionConfig, GuardrailsConfig, LengthClass, RoutingConfig
from argosy.gateway.admission import Admission
from argosy.gateway.errors import GatewayError
from argosy.gateway.guardrails import Blocked, Guardrails, StreamGuard, iban_ok, luhn_ok
from argosy.gateway.health import OPEN, Upstream
from argosy.gateway.prefix_index import PrefixIndex, prefix_hashes
from argosy.gateway.ratelimit import MemoryLimiter
from argosy.gateway.router import Router, RouteRequest
from argosy.gateway.scraper import parse_gauges


def ups(n):
    return [Upstream(f"http://u{i}") for i in range(n)]


def router(policy, n=4, classes=None, **kw):
    r = Router(RoutingConfig(policy=policy, **kw), classes, PrefixIndex())
    u = ups(n)
    r.set_upstreams(u)
    return r, u


def test_prefix_index_longest_match_ttl_and_bound():
    idx = PrefixIndex(max_blocks=100, ttl_s=0.2)
    sys_prompt = "S" * 640
    h1 = prefix_hashes(sys_prompt + "tenant one question", 64)
    h2 = prefix_hashes(sys_prompt + "x" * 200, 64)
    idx.insert(h1, "a")
    m = idx.match(h2, ["a", "b"])
    assert m == {"a": 10, "b": 0}  # the shared 640-char system prompt, not the differing tail
    time.sleep(0.25)
    assert idx.match(h2, ["a"]) == {"a": 0}  # aged out
    idx.insert(prefix_hashes("z" * 64 * 150, 64), "a")
    assert len(idx) <= 100


def test_round_robin_and_least_load():
    r, u = router("round_robin", 3)
    picks = [r.choose(RouteRequest("p", 1)).url for _ in range(6)]
    assert sorted(picks) == sorted([x.url for x in u] * 2)
    r, u = router("least_load", 3)
    u[0].in_flight, u[1].in_flight, u[2].in_flight = 5, 1, 3
    assert r.choose(RouteRequest("p", 1)) is u[1]
    u[1].waiting = 10  # scraped queue at the replica counts too
    assert r.choose(RouteRequest("p", 1)) is u[2]


def test_prefix_affinity_and_balance_gate():
    r, u = router("prefix", 4, balance_abs=2, balance_rel=1.5)
    shared = "You are the support bot of tenant A. " * 40
    first = r.choose(RouteRequest(shared + "q1", 400))
    first.in_flight += 1
    # same tenant: sticks to the upstream that has the prefix while load stays balanced enough
    assert r.choose(RouteRequest(shared + "q2", 400)) is first
    first.in_flight += 2  # now 3 in flight vs 0 elsewhere: over abs 2 and rel 1.5
    other = r.choose(RouteRequest(shared + "q3", 400))
    assert other is not first
    # a new tenant goes to the least loaded, not to the hot one
    first.in_flight, other.in_flight = 0, 0
    u[0].in_flight = u[1].in_flight = u[2].in_flight = u[3].in_flight = 1
    first.in_flight = 0
    assert r.choose(RouteRequest("tenant B " * 100, 200)) is first


def test_session_consistent_with_bounded_load():
    r, u = router("session", 4)
    a = r.choose(RouteRequest("p", 1, "alice"))
    assert all(r.choose(RouteRequest("p", 1, "alice")) is a for _ in range(5))
    a.in_flight = 10  # over the bound (1.25 x mean): alice spills to the next upstream on the ring
    b = r.choose(RouteRequest("p", 1, "alice"))
    assert b is not a
    a.in_flight = 0
    assert r.choose(RouteRequest("p", 1, "alice")) is a
    spread = {r.choose(RouteRequest("p", 1, f"user{i}")).url for i in range(50)}
    assert len(spread) == 4


def test_length_classes_pools_and_fallback():
    classes = [LengthClass(max_prompt_tokens=512, replicas=2), LengthClass(max_prompt_tokens=8192, replicas=1),
               LengthClass(max_prompt_tokens=100000, replicas=1)]
    r, u = router("length_classes", 4, classes)
    assert {r.choose(RouteRequest("p", 4)).url for _ in range(6)} == {u[0].url, u[1].url}
    assert r.choose(RouteRequest("p", 4000)) is u[2]
    assert r.choose(RouteRequest("p", 50000)) is u[3]
    u[2].state, u[2].opened_at = OPEN, time.monotonic()
    assert r.choose(RouteRequest("p", 4000)) is u[3]  # its class is down: a longer class takes it


def test_breaker_opens_half_opens_and_closes():
    u = Upstream("http://x", eject_after=2, eject_for=0.1)
    u.failure()
    assert u.available()
    u.failure()
    assert u.state == OPEN and not u.available()
    time.sleep(0.12)
    assert u.available()
    u.on_start(1)  # the probe
    assert not u.available()  # one probe at a time
    u.on_end(1)
    u.success()
    assert u.state == "closed" and u.available()


def test_parse_gauges():
    g = parse_gauges(b'# HELP x\nvllm:num_requests_waiting{model_name="a"} 3\nvllm:num_requests_waiting{model_name="b"}'
                     b' 2\nvllm:kv_cache_usage_perc{model_name="a"} 0.5\nvllm:num_requests_waiting_x 9\n')
    assert g == {"waiting": 5.0, "kv_usage": 0.5}


def test_admission_priority_timeout_and_queue_bound():
    async def main():
        a = Admission(AdmissionConfig(max_in_flight=1, max_queue=2, queue_timeout_s=0.3))
        await a.acquire(0)
        order = []

        async def waiter(p, tag):
            await a.acquire(p)
            order.append(tag)

        tb = asyncio.create_task(waiter(1, "batch"))
        await asyncio.sleep(0.01)
        ti = asyncio.create_task(waiter(0, "interactive"))
        await asyncio.sleep(0.01)
        with pytest.raises(GatewayError) as e:  # queue (2) is full
            await a.acquire(0)
        assert e.value.status == 503 and e.value.retry_after
        a.release()
        await asyncio.sleep(0.01)
        assert order == ["interactive"]  # admitted before the batch request that queued first
        a.release()
        await asyncio.gather(tb, ti)
        assert order == ["interactive", "batch"]
        with pytest.raises(GatewayError) as e:
            await a.acquire(0)  # 1 in flight, nobody releases: times out
        assert e.value.code == "queue_timeout"
        a.release()
        assert a.in_flight == 0 and a.waiting == 0
    asyncio.run(main())


def test_memory_limiter_rpm_tpm_and_reconcile():
    async def main():
        lim = MemoryLimiter()
        for _ in range(3):
            assert await lim.take("k", 3, None, 1) == 0
        wait = await lim.take("k", 3, None, 1)
        assert 19 < wait <= 20.5  # one request per 20 s at 3 rpm
        assert await lim.take("t", None, 100, 80) == 0
        assert await lim.take("t", None, 100, 80) > 0
        await lim.adjust("t", 100, 70)  # it really used 10
        assert await lim.take("t", None, 100, 80) == 0
    asyncio.run(main())


def test_pii_checks():
    assert luhn_ok("4111 1111 1111 1111") and not luhn_ok("4111 1111 1111 1112")
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE89 3704 0044 0532 0130 01")
    g = Guardrails(GuardrailsConfig(input=[{"pii": "redact"}]), None)
    out = asyncio.run(g.check_input(["mail a.b@example.org, card 4111-1111-1111-1111, call +44 20 7946 0958,"
                                     " IBAN GB82 WEST 1234 5698 7654 32, order 12345"], 10))
    assert out == ["mail [EMAIL], card [CREDIT_CARD], call [PHONE], IBAN [IBAN], order 12345"]


@pytest.mark.parametrize("cut", [3, 7, 11, 15])
def test_stream_guard_catches_a_split_match(cut):
    g = Guardrails(GuardrailsConfig(output=[{"blocklist": ["secret plan"]}], stream_window_chars=16), None)
    text = "here is the secret plan for today " + "filler " * 10
    i = text.index("secret") + cut
    sg = StreamGuard(g)
    with pytest.raises(Blocked):
        for piece in (text[:i], text[i:]):
            released = sg.feed(piece)
            assert "secret plan" not in released


def test_stream_guard_redacts_split_pii_and_releases_everything_else():
    g = Guardrails(GuardrailsConfig(output=[{"pii": "redact"}]), None)
    sg = StreamGuard(g)
    pieces = ["Write to jane", ".doe@exa", "mple.com today. ", "x" * 100]
    out = "".join(sg.feed(p) for p in pieces) + asyncio.run(sg.finish())
    assert out == "Write to [EMAIL] today. " + "x" * 100
