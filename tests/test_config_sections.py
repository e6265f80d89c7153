"""Every fleet-file section (and the price file) refuses a yes/no where a number belongs: YAML reads `yes`,
`on` and `true` as True, and pydantic alone reads True as 1, so `max_replicas: yes` was one replica."""

import re
from typing import Annotated, Any

import pytest
from pydantic import Field

from argosy.config import FleetConfigError, load_fleet, parse_fleet
from argosy.config_section import takes_a_number_not_a_bool
from argosy.cost.prices import DEFAULT_PRICES, PriceError, load_prices

NUMBER, TEXT = "where a number belongs", "quote it"  # `name: no` had said only "Input should be a valid string"


@pytest.mark.parametrize("model_yaml, where, says", [
    ("autoscaling: {max_replicas: yes}", "models.0.autoscaling.max_replicas", NUMBER),
    ("autoscaling: {target: on}", "models.0.autoscaling.target", NUMBER),
    ("engine: {max_num_seqs: true}", "models.0.engine.max_num_seqs", NUMBER),
    ("engine: {kv_cache_memory_gib: yes}", "models.0.engine.kv_cache_memory_gib", NUMBER),
    ("routing: {balance_abs: no}", "models.0.routing.balance_abs", NUMBER),
    ("revision: on", "models.0.revision", TEXT),
    ("routing: {policy: off}", "models.0.routing.policy", TEXT),
])
def test_a_yes_or_no_where_a_number_or_text_belongs_is_named(tmp_path, model_yaml, where, says):
    path = tmp_path / "fleet.yaml"
    path.write_text(f"models:\n  - name: m\n    checkpoint: /ckpt\n    {model_yaml}\n")
    with pytest.raises(FleetConfigError) as e:
        load_fleet(path)
    assert f"{where}: " in str(e.value) and says in str(e.value), str(e.value)


def test_a_name_read_as_a_yes_or_no_says_to_quote_it_and_reads_quoted(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  - name: no\n    checkpoint: /ckpt\n")
    with pytest.raises(FleetConfigError) as e:
        load_fleet(path)
    assert "models.0.name: " in str(e.value) and TEXT in str(e.value)
    path.write_text('models:\n  - name: "no"\n    checkpoint: /ckpt\n')
    assert load_fleet(path).models[0].name == "no"


def test_numbers_and_real_yes_no_settings_still_read():
    model = parse_fleet({"models": [{"name": "m", "checkpoint": "/ckpt", "debug": True,
                                     "autoscaling": {"max_replicas": 3, "target": 2.5, "scale_to_zero_after_s": None},
                                     "engine": {"max_num_seqs": 8, "enable_prefix_caching": False}}]}).models[0]
    assert model.debug is True and model.autoscaling.max_replicas == 3 and model.autoscaling.target == 2.5
    assert model.engine.max_num_seqs == 8 and model.engine.enable_prefix_caching is False


@pytest.mark.parametrize("annotation, number", [
    (int, True), (float, True), (int | None, True), (Annotated[float, Field(gt=0)], True),
    (float | str, True), (bool, False), (bool | int, False), (str, False), (Any, False), (list[int], False),
])
def test_which_annotations_take_a_number(annotation, number):
    assert takes_a_number_not_a_bool(annotation) is number


def test_a_price_given_as_yes_is_refused(tmp_path):
    book = DEFAULT_PRICES.read_text()
    price = re.search(r"usd_per_gpu_hour: [0-9.]+", book).group()
    path = tmp_path / "prices.yaml"
    path.write_text(book.replace(price, "usd_per_gpu_hour: yes", 1))
    with pytest.raises(PriceError, match=r"gpu_prices\.0\.usd_per_gpu_hour.*where a number belongs"):
        load_prices(path)
