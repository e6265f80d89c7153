import math

import pytest
import torch

from argosy.engine.logits_processors import apply_min_p, apply_penalties, apply_top_k, apply_top_p
from argosy.engine.sampler import Sampler
from argosy.engine.sampling_params import SamplingParams
from argosy.engine.sequence import Sequence

V = 40
EOS = 3


def make_seq(prompt=(1, 2, 3), outputs=(), seed=None, **params) -> Sequence:
    seq = Sequence(request_id="r", prompt_token_ids=list(prompt), params=SamplingParams(**params))
    for t in outputs:
        seq.append_token(t)
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def ref_support(probs: list[float], temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> set[int]:
    """The tokens that may be sampled, from the definitions, one token at a time."""
    w = [p ** (1.0 / temperature) for p in probs]
    w = [x / sum(w) for x in w]
    order = sorted(range(len(w)), key=lambda i: -w[i])
    keep = set(order[:top_k] if top_k else order)
    mass = sum(w[i] for i in keep)
    above, kept_p = 0.0, set()
    for i in order:
        if i in keep:
            if above < top_p:
                kept_p.add(i)
            above += w[i] / mass
    top = max(w[i] for i in kept_p)
    return {i for i in kept_p if w[i] >= min_p * top}


def test_greedy_is_argmax_in_any_dtype():
    torch.manual_seed(0)
    logits = torch.randn(8, V)
    seqs = [make_seq(temperature=0.0) for _ in range(8)]
    sampler = Sampler(V, {EOS})
    assert sampler(logits, seqs).token_ids == logits.argmax(-1).tolist()
    half = logits.to(torch.bfloat16)
    out = sampler(half, seqs)
    assert out.token_ids == half.float().argmax(-1).tolist()
    assert out.logprobs == [None] * 8 and out.sampled_logprobs == [None] * 8


def test_greedy_rows_stay_argmax_in_a_mixed_batch():
    torch.manual_seed(9)
    logits = torch.randn(6, V)
    seqs = [make_seq(temperature=0.0), make_seq(seed=5), make_seq(temperature=0.0, logprobs=2),
            make_seq(top_p=0.5), make_seq(temperature=0.0, min_tokens=0), make_seq(repetition_penalty=1.3)]
    tokens = Sampler(V, {EOS})(logits, seqs).token_ids
    for i in (0, 2, 4):
        assert tokens[i] == logits[i].argmax().item()


def test_top_k_1_is_greedy():
    torch.manual_seed(1)
    logits = torch.randn(16, V)
    seqs = [make_seq(temperature=1.3, top_k=1) for _ in range(16)]
    assert Sampler(V, {EOS})(logits, seqs).token_ids == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_blocks_eos_and_stop_ids_until_reached(temperature, ignore_eos):
    logits = torch.full((1, V), -5.0)
    logits[0, EOS], logits[0, 7], logits[0, 9] = 10.0, 9.0, 0.0
    sampler = Sampler(V, {EOS})
    for n_out in range(4):
        seq = make_seq(outputs=[11] * n_out, min_tokens=2, stop_token_ids=[7, V + 5],
                       temperature=temperature, ignore_eos=ignore_eos)
        rows = 200 if temperature else 1
        tokens = set(sampler(logits.expand(rows, V), [seq] * rows).token_ids)
        if n_out < 2:
            assert tokens.isdisjoint({EOS, 7}), tokens
        else:
            assert EOS in tokens


def ref_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    out = logits.clone()
    for i, s in enumerate(seqs):
        p = s.params
        for v in range(logits.shape[1]):
            x = out[i, v].item()
            if v in s.prompt_token_ids or v in s.output_token_ids:
                x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
            count = s.output_token_ids.count(v)
            x -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
            out[i, v] = x
    return out


def test_penalties_match_their_definitions():
    torch.manual_seed(2)
    logits = torch.randn(7, V) * 3
    seqs = [
        make_seq(prompt=[1, 2, 2, 30], outputs=[5, 5, 5, 1, 8], repetition_penalty=1.7),
        make_seq(prompt=[1, 2], outputs=[5, 5, 5, 1, 8], presence_penalty=1.5),
        make_seq(prompt=[4, 6], outputs=[5, 5, 5, 4, 9], frequency_penalty=0.7),
        make_seq(prompt=[0, 39], outputs=[], repetition_penalty=0.6, presence_penalty=-1.0, frequency_penalty=2.0),
        make_seq(prompt=list(range(20)), outputs=[21, 21, 20, 3], repetition_penalty=1.2,
                 presence_penalty=0.5, frequency_penalty=-0.5),
        make_seq(prompt=[V + 3, V], outputs=[], repetition_penalty=3.0, presence_penalty=1.0),  # out-of-vocab prompt
        make_seq(prompt=[V + 1, 7, 7, V + 9], outputs=[7, 0], repetition_penalty=0.5, presence_penalty=2.0),
    ]
    got = apply_penalties(logits.clone(), seqs)
    torch.testing.assert_close(got, ref_penalties(logits, seqs))
    # Presence/frequency ignore prompt tokens; repetition covers them.
    assert got[1, 2] == logits[1, 2] and got[2, 6] == logits[2, 6]
    assert got[0, 30] != logits[0, 30]


@pytest.mark.parametrize("penalty", [1e-300, 1e-45, 1e300])
def test_a_repetition_penalty_past_float32_keeps_the_logits_finite(penalty):
    # The request accepts any penalty > 0, as vLLM does; in float32 1e-300 is 0 (a seen token's logit / 0 =
    # inf, and softmax of inf is NaN: the row sampled token 0 whatever it had seen) and 1e300 is inf.
    logits = torch.tensor([[4.0, 3.5, 1.0, -1.0] + [-9.0] * (V - 4)] * 2)
    seqs = [make_seq(prompt=[1, 3], temperature=0.8, repetition_penalty=penalty, seed=5),
            make_seq(prompt=[1, 3], temperature=0.0)]
    got = apply_penalties(logits.clone(), seqs)
    assert torch.isfinite(got).all()
    tokens = Sampler(V, {EOS})(logits, seqs).token_ids
    # A tiny penalty makes seen tokens all but certain; a huge one all but rules them out.
    assert (tokens[0] in (1, 3) if penalty < 1 else tokens[0] != 3) and tokens[1] == 0


def test_a_top_p_below_float32s_smallest_keeps_the_most_likely_token():
    # top_p is accepted in (0, 1]; 1e-300 is 0 in float32, where no token's mass above it is "< p": every
    # token had been dropped, the row was all -inf, and the request sampled token 0 each step.
    logits = torch.tensor([[1.0, 3.0, 2.0] + [-9.0] * (V - 3)])
    got = apply_top_p(logits.clone(), [1e-300])
    assert torch.isfinite(got[0, 1]) and torch.isinf(got[0, [0, 2]]).all()
    assert Sampler(V, {EOS})(logits, [make_seq(temperature=1.0, top_p=1e-300, seed=3)]).token_ids == [1]


def test_penalties_steer_greedy_choice_without_touching_caller_logits():
    logits = torch.tensor([[4.0, 3.5, 1.0, -1.0] + [-9.0] * (V - 4)] * 3)
    before = logits.clone()
    seqs = [
        make_seq(prompt=[0], temperature=0.0, repetition_penalty=2.0),  # 4.0 -> 2.0 < 3.5
        make_seq(prompt=[9], outputs=[0], temperature=0.0, presence_penalty=1.0),  # 4.0 -> 3.0 < 3.5
        make_seq(prompt=[0, 0, 0], outputs=[1], temperature=0.0, frequency_penalty=0.2),  # prompt ignored
    ]
    assert Sampler(V, {EOS})(logits, seqs).token_ids == [1, 1, 0]
    assert torch.equal(logits, before)


@pytest.mark.parametrize("settings", [
    dict(top_p=0.6),
    dict(top_p=0.75, temperature=0.5),
    dict(min_p=0.3),
    dict(top_k=3),
    dict(top_k=4, top_p=0.8),
    dict(top_k=5, top_p=0.95, min_p=0.2, temperature=1.5),
])
def test_filters_keep_exactly_the_right_support(settings):
    probs = [0.05, 0.33, 0.02, 0.24, 0.17, 0.12, 0.07]
    logits = torch.full((1, V), -math.inf)
    logits[0, : len(probs)] = torch.tensor(probs).log()
    rows = 3000
    seqs = [make_seq(**settings) for _ in range(rows)]
    out = Sampler(V, {EOS}, seed=7)(logits.expand(rows, V), seqs).token_ids
    assert set(out) == ref_support(probs, **settings)


def test_filters_on_a_large_vocab_match_a_full_sort():
    # Flat rows have a nucleus far wider than apply_top_p's first top-k window, peaked rows a narrow one.
    torch.manual_seed(8)
    vocab = 5000
    logits = torch.randn(4, vocab) * torch.tensor([[0.05], [0.3], [3.0], [8.0]])
    top_p, top_k, min_p = [0.9, 0.5, 0.95, 0.3], [1, 7, 300, 4999], [0.9, 0.5, 0.01, 0.0]
    for i in range(4):
        probs = logits[i].softmax(-1)
        order = probs.argsort(descending=True).tolist()
        above, want_p = 0.0, set()
        for t in order:
            if above < top_p[i]:
                want_p.add(t)
            above += probs[t].item()
        got = apply_top_p(logits.clone(), top_p)
        assert set(got[i].isfinite().nonzero().flatten().tolist()) == want_p
        got = apply_top_k(logits.clone(), top_k)
        assert set(got[i].isfinite().nonzero().flatten().tolist()) == set(order[: top_k[i]])
        got = apply_min_p(logits.clone(), min_p)
        want_m = {t for t in range(vocab) if probs[t] >= min_p[i] * probs.max()}
        assert set(got[i].isfinite().nonzero().flatten().tolist()) == want_m


def test_sampling_follows_tempered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = torch.full((1, V), -math.inf)
    logits[0, :3] = probs.log()
    rows = 8000
    out = torch.tensor(Sampler(V, {EOS}, seed=3)(logits.expand(rows, V), [make_seq(temperature=0.5)] * rows).token_ids)
    freq = torch.bincount(out, minlength=3)[:3].float() / rows
    expected = probs**2 / (probs**2).sum()
    torch.testing.assert_close(freq, expected, atol=0.03, rtol=0)


def run_steps(sampler: Sampler, logits: torch.Tensor, batch: list[Sequence], steps: int) -> list[list[int]]:
    outs = []
    for _ in range(steps):
        tokens = sampler(logits[: len(batch)], batch).token_ids
        for s, t in zip(batch, tokens, strict=True):
            s.append_token(t)
        outs.append(tokens)
    return outs


def test_seeded_rows_ignore_the_rest_of_the_batch():
    torch.manual_seed(4)
    row = torch.randn(V)  # the seeded sequence always sees the same logits
    others = torch.randn(6, V)

    def stream(batch_before: int, batch_after: int) -> list[int]:
        target = make_seq(seed=1234, top_p=0.9)
        before = [make_seq(seed=b if b % 2 else None, temperature=0.8) for b in range(batch_before)]
        after = [make_seq(temperature=0.0 if a % 2 else 1.0, top_k=5) for a in range(batch_after)]
        logits = torch.cat([others[:batch_before], row[None], others[batch_before: batch_before + batch_after]])
        sampler = Sampler(V, {EOS}, seed=batch_before * 10 + batch_after)
        outs = run_steps(sampler, logits, before + [target] + after, 12)
        return [step[batch_before] for step in outs]

    alone = stream(0, 0)
    assert stream(3, 2) == alone
    assert stream(0, 5) == alone
    assert stream(5, 0) == alone
    other_seed = make_seq(seed=99, top_p=0.9)
    assert [s[0] for s in run_steps(Sampler(V, {EOS}), row[None], [other_seed], 12)] != alone


def test_logprobs_are_raw_log_softmax_with_ranks():
    torch.manual_seed(5)
    logits = torch.randn(4, V + 6) * 2
    logits[:, V:] = 50.0  # vocab padding: never reported nor sampled
    seqs = [
        make_seq(logprobs=3, temperature=0.7, repetition_penalty=1.5, presence_penalty=1.0, outputs=[1, 2]),
        make_seq(),
        make_seq(logprobs=0, temperature=0.0, frequency_penalty=2.0, outputs=[5]),
        make_seq(logprobs=5, top_k=2),
    ]
    out = Sampler(V, {EOS})(logits, seqs)
    ref = logits[:, :V].log_softmax(-1)
    assert out.logprobs[1] is None and out.sampled_logprobs[1] is None
    for i, k in [(0, 3), (2, 0), (3, 5)]:
        tok, entry = out.token_ids[i], out.logprobs[i]
        assert out.sampled_logprobs[i] == pytest.approx(ref[i, tok].item(), abs=1e-5)
        assert entry[tok].logprob == pytest.approx(ref[i, tok].item(), abs=1e-5)
        assert entry[tok].rank == int((ref[i] > ref[i, tok]).sum()) + 1
        top = ref[i].argsort(descending=True)[:k].tolist()
        assert set(entry) == set(top) | {tok}
        for r, t in enumerate(top):
            assert entry[t].rank == r + 1
            assert entry[t].logprob == pytest.approx(ref[i, t].item(), abs=1e-5)


def test_never_samples_vocab_padding():
    logits = torch.randn(64, V + 24)
    logits[:, V:] = 1e4
    seqs = [make_seq(temperature=t, top_p=p, seed=s)
            for t in (0.0, 1.0, 5.0) for p in (1.0, 0.9) for s in (None, 1)] * 6
    seqs = seqs[:64]
    tokens = Sampler(V, {EOS})(logits, seqs).token_ids
    assert max(tokens) < V and min(tokens) >= 0


@pytest.mark.parametrize("field, value", [("temperature", math.nan), ("temperature", math.inf),
                                          ("repetition_penalty", math.inf), ("repetition_penalty", math.nan)])
def test_the_offline_api_refuses_sampling_numbers_that_are_not_finite(field, value):
    from argosy.engine.sampling_params import SamplingParams, SamplingParamsError

    # The server's JSON has no NaN or Infinity; LLM.generate and `argosy generate` take any float, and a NaN
    # temperature had sampled 64 tokens from NaN probabilities.
    with pytest.raises(SamplingParamsError, match=f"{field} must be .*finite"):
        SamplingParams(**{field: value})


def test_logit_bias_bans_and_forces_tokens_in_its_own_row_only():
    torch.manual_seed(4)
    logits = torch.randn(4, V)
    top = logits.argmax(-1).tolist()
    seqs = [make_seq(temperature=0.0, logit_bias={top[0]: -100}),  # greedy: the best token banned
            make_seq(temperature=0.0, logit_bias={7: 100}),  # greedy: forced
            make_seq(temperature=0.0),  # no bias: untouched by its neighbours'
            make_seq(seed=3, logit_bias={t: -100 for t in range(V) if t != 11})]  # sampled: only 11 is left
    before = logits.clone()
    tokens = Sampler(V, {EOS})(logits, seqs).token_ids
    assert tokens[0] == logits[0].clone().index_fill_(0, torch.tensor([top[0]]), -1e9).argmax().item() != top[0]
    assert tokens[1] == 7 and tokens[2] == top[2] and tokens[3] == 11
    assert torch.equal(logits, before)


def test_logit_bias_values_are_clamped_and_checked():
    assert SamplingParams(logit_bias={1: 1e308, 2: -float("inf"), 3: 0.5}).logit_bias == {1: 100.0, 2: -100.0, 3: 0.5}
    assert SamplingParams(logit_bias={}).logit_bias is None
    for bad in ({-1: 1.0}, {"1": 1.0}, {True: 1.0}, {1: float("nan")}, {1: "x"}, [1, 2]):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_prompt_logprobs_are_the_same_taken_a_few_rows_at_a_time():
    from argosy.engine.sampler import prompt_logprobs

    torch.manual_seed(2)
    logits = torch.randn(10, V)
    ids = torch.randint(0, V, (10,)).tolist()
    whole, sliced = prompt_logprobs(logits, ids, [3] * 10), prompt_logprobs(logits, ids, [3] * 10, rows_at_once=4)
    assert whole == sliced and len(whole) == 10
    for row, token, entry in zip(logits, ids, whole, strict=True):
        assert entry[token].logprob == pytest.approx(row.log_softmax(-1)[token].item(), abs=1e-6)
        assert entry[token].rank == int((row >= row[token]).sum())
        assert sorted(lp.rank for lp in entry.values())[:3] == [1, 2, 3]
