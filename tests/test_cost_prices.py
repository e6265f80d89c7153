"""The price book: the shipped file, lookups, and clear errors for bad files."""

import textwrap

import pytest
import yaml

from argosy.cost.prices import DEFAULT_PRICES, PriceError, load_prices

SMALL_BOOK = """\
note: test prices, made up
gpu_prices:
  - {gpu: H100, provider: alpha, tier: on_demand, usd_per_gpu_hour: 3.00, source: test, as_of: 2025-01}
  - {gpu: h100, provider: beta, tier: on_demand, usd_per_gpu_hour: 2.50, source: test, as_of: 2025-01-15}
  - {gpu: H100, provider: beta, tier: spot, usd_per_gpu_hour: 1.20, source: test, as_of: 2025-01}
  - {gpu: L40S, provider: alpha, tier: on_demand, usd_per_gpu_hour: 1.00, source: test, as_of: 2025-01}
api_prices:
  - {provider: hosted, model: big, input_usd_per_mtok: 1.0, output_usd_per_mtok: 3.0, source: test, as_of: 2025-01}
  - {provider: hosted, model: small, input_usd_per_mtok: 0.1, output_usd_per_mtok: 0.2, source: test, as_of: 2025-01}
  - {provider: solo, model: only, input_usd_per_mtok: 0.5, output_usd_per_mtok: 0.5, source: test, as_of: 2025-01}
overheads:
  engineering: {fte: 0.1, loaded_annual_salary_usd: 87600, source: test, as_of: 2025-01}
  monitoring: {usd_per_node_month: 80, fixed_usd_month: 20, gpus_per_node: 8, source: test, as_of: 2025-01}
  operations: {usd_month: 730, source: test, as_of: 2025-01}
"""


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(SMALL_BOOK)
    return load_prices(path)


def test_shipped_book_is_complete_and_sourced():
    book = load_prices()
    # The GPU names the simulator's accelerator catalogue uses all have an on-demand price.
    for gpu in ("H100", "H200", "B200", "A100", "L40S"):
        assert book.gpu_hour(gpu) > 0
    raw = yaml.safe_load(DEFAULT_PRICES.read_text())
    for entry in raw["gpu_prices"] + raw["api_prices"] + list(raw["overheads"].values()):
        assert entry.get("source") and entry.get("as_of"), entry
    assert "change" in book.note and "check" in book.note
    assert len(book.api_prices) >= 3
    assert {t for p in book.gpu_prices for t in [p.tier]} == {"on_demand", "reserved", "spot"}


def test_lookup_cheapest_provider_case_insensitive(book):
    assert book.gpu_hour("H100") == 2.50  # beta is cheaper than alpha's 3.00
    assert book.gpu_hour("h100", "on_demand", "ALPHA") == 3.00
    assert book.gpu_hour("H100", "spot") == 1.20
    assert book.gpu_price("h100").provider == "beta"
    assert book.gpu_price("H100").as_of == "2025-01-15"  # YAML's date read back as text


@pytest.mark.parametrize("call, message", [
    (lambda b: b.gpu_hour("MI300X"), "unknown GPU 'MI300X'; the price book has: H100, L40S"),
    (lambda b: b.gpu_hour("H100", "monthly"), "unknown tier 'monthly'; tiers: on_demand, reserved, spot"),
    (lambda b: b.gpu_hour("H100", provider="gamma"), "unknown provider 'gamma'; the price book has: alpha, beta"),
    (lambda b: b.gpu_hour("H100", "reserved"), "no reserved price for H100; the book has H100 at: "
                                               "alpha/on_demand, beta/on_demand, beta/spot"),
    (lambda b: b.gpu_hour("L40S", "spot", "alpha"), "no spot price for L40S from alpha"),
])
def test_unknown_lookups_name_what_is_known(book, call, message):
    with pytest.raises(PriceError) as e:
        call(book)
    assert message in str(e.value)


def test_api_lookup(book):
    assert book.api("hosted/big").output_usd_per_mtok == 3.0
    assert book.api("SOLO").model == "only"  # a provider with one model needs no model name
    with pytest.raises(PriceError, match="ambiguous API 'hosted'"):
        book.api("hosted")
    with pytest.raises(PriceError, match="unknown API 'nobody'; the price book has: hosted/big, hosted/small"):
        book.api("nobody")


def _edited(old: str, new: str) -> str:
    assert old in SMALL_BOOK
    return SMALL_BOOK.replace(old, new, 1)


@pytest.mark.parametrize("text, message", [
    (_edited("source: test, as_of: 2025-01}", "as_of: 2025-01}"), "gpu_prices.0.source: Field required"),
    (_edited("usd_per_gpu_hour: 3.00", "usd_per_gpu_hour: -3"), "gpu_prices.0.usd_per_gpu_hour"),
    (_edited("tier: spot", "tier: weekly"), "gpu_prices.2.tier"),
    (_edited("as_of: 2025-01}", "as_of: last week}"), "gpu_prices.0.as_of"),
    (_edited("provider: beta, tier: spot", "provider: alpha, tier: on_demand"),
     "H100 / alpha / on_demand is listed twice"),
    (_edited("note: test prices", "colour: blue\nnote: test prices"), "colour: Extra inputs are not permitted"),
    (_edited("gpus_per_node: 8", "gpus_per_node: 0"), "overheads.monitoring.gpus_per_node"),
    ("gpu_prices: [unclosed", "not valid YAML"),
    ("- just\n- a list\n", "a price file is a mapping"),
])
def test_bad_price_file_is_a_one_line_error(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(PriceError) as e:
        load_prices(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(path) in str(e.value)


def test_missing_price_file(tmp_path):
    with pytest.raises(PriceError, match="cannot read price file .*nope.yaml"):
        load_prices(tmp_path / "nope.yaml")
