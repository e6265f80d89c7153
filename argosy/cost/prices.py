"""The price book: GPU-hour prices per provider and tier, hosted-API token prices, overhead defaults.

The default book ships as `prices.yaml` beside this file; `argosy cost --prices my.yaml` reads a copy
the user edited. Every price carries its source and as-of date: list prices change, check them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from argosy.config_section import ConfigSection

DEFAULT_PRICES = Path(__file__).parent / "prices.yaml"
TIERS = ("on_demand", "reserved", "spot")  # reserved: a 1-year commitment, paid whether used or not
Tier = Literal["on_demand", "reserved", "spot"]


class PriceError(ValueError):
    """A price file that cannot be read, or a GPU / tier / provider / API the book does not hold."""


class _Strict(ConfigSection):  # extra keys and a yes/no for a price refused, as in the fleet file
    model_config = ConfigDict(frozen=True)


class _Sourced(_Strict):
    source: str = Field(min_length=1)  # a URL or a document
    as_of: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")  # when the figure was read: 2025-06 or 2025-06-01
    note: str = ""

    @field_validator("as_of", mode="before")
    @classmethod
    def _date_as_text(cls, v: object) -> object:
        return str(v) if v is not None else v  # YAML reads 2025-06-01 as a date


class GpuPrice(_Sourced):
    gpu: str
    provider: str
    tier: Tier
    usd_per_gpu_hour: float = Field(gt=0)

    @field_validator("gpu")
    @classmethod
    def _upper(cls, v: str) -> str:
        return v.strip().upper()


class ApiPrice(_Sourced):
    provider: str
    model: str
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    # The served model's size, in billions of parameters: reports compare self-hosting only with APIs of
    # a comparable size (an 8B fleet against 70B prices flatters it ninefold). None: unknown, always shown.
    params_b: float | None = Field(None, gt=0)


class Engineering(_Sourced):
    fte: float = Field(ge=0)  # engineers' time given to running the fleet, in full-time equivalents
    loaded_annual_salary_usd: float = Field(ge=0)  # salary plus benefits, taxes, equipment


class Monitoring(_Sourced):
    usd_per_node_month: float = Field(ge=0)  # per-host metrics/logs agents (e.g. a hosted monitoring plan)
    fixed_usd_month: float = Field(ge=0)
    gpus_per_node: int = Field(ge=1)


class Operations(_Sourced):
    usd_month: float = Field(ge=0)  # storage, egress, on-call tooling, CPU hosts for gateways


class Overheads(_Strict):
    engineering: Engineering
    monitoring: Monitoring
    operations: Operations


class ServedPrice(_Strict):
    """What the gateway charges a key for a model it serves ($ per million tokens): a chargeback rate."""
    model: str  # a served model's name, or "*" for every model without its own line
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    note: str | None = None


class PriceBook(_Strict):
    note: str = Field(min_length=1)  # what the prices are and that they must be checked
    gpu_prices: list[GpuPrice] = Field(min_length=1)
    api_prices: list[ApiPrice] = []
    served_prices: list[ServedPrice] = []
    overheads: Overheads

    def served(self, model: str) -> ServedPrice | None:
        """The rate keys pay for `model`: its own line, else the "*" line, else None (no spend counted)."""
        by_model = {p.model: p for p in self.served_prices}
        return by_model.get(model) or by_model.get("*")

    @model_validator(mode="after")
    def _no_duplicates(self) -> PriceBook:
        seen: set[tuple[str, str, str]] = set()
        for p in self.gpu_prices:
            key = (p.gpu, p.provider.lower(), p.tier)
            if key in seen:
                raise ValueError(f"gpu_prices: {p.gpu} / {p.provider} / {p.tier} is listed twice")
            seen.add(key)
        return self

    @property
    def gpus(self) -> list[str]:
        return sorted({p.gpu for p in self.gpu_prices})

    @property
    def providers(self) -> list[str]:
        return sorted({p.provider for p in self.gpu_prices})

    def gpu_price(self, gpu: str, tier: str = "on_demand", provider: str | None = None) -> GpuPrice:
        """The cheapest matching entry (from `provider` only, when given); PriceError names what is known."""
        name = gpu.strip().upper()
        if name not in self.gpus:
            raise PriceError(f"unknown GPU {gpu!r}; the price book has: {', '.join(self.gpus)}")
        if tier not in TIERS:
            raise PriceError(f"unknown tier {tier!r}; tiers: {', '.join(TIERS)}")
        if provider is not None and provider.lower() not in {p.lower() for p in self.providers}:
            raise PriceError(f"unknown provider {provider!r}; the price book has: {', '.join(self.providers)}")
        rows = [p for p in self.gpu_prices if p.gpu == name and p.tier == tier
                and (provider is None or p.provider.lower() == provider.lower())]
        if not rows:
            have = sorted({f"{p.provider}/{p.tier}" for p in self.gpu_prices if p.gpu == name})
            raise PriceError(f"no {tier} price for {name}" + (f" from {provider}" if provider else "")
                             + f"; the book has {name} at: {', '.join(have)}")
        return min(rows, key=lambda p: p.usd_per_gpu_hour)

    def gpu_hour(self, gpu: str, tier: str = "on_demand", provider: str | None = None) -> float:
        """$ per GPU-hour: the cheapest provider's when `provider` is None."""
        return self.gpu_price(gpu, tier, provider).usd_per_gpu_hour

    def api(self, name: str) -> ApiPrice:
        """One API offering by `provider/model`, or by `provider` alone when it has one model in the book."""
        matches = [a for a in self.api_prices if name.lower() in (f"{a.provider}/{a.model}".lower(),
                                                                   a.provider.lower())]
        if len(matches) != 1:
            known = ", ".join(f"{a.provider}/{a.model}" for a in self.api_prices) or "none"
            what = "ambiguous" if matches else "unknown"
            raise PriceError(f"{what} API {name!r}; the price book has: {known}")
        return matches[0]


def load_prices(path: str | Path | None = None) -> PriceBook:
    """Read a price file (the shipped one when `path` is None); PriceError with a one-line reason."""
    path = Path(path) if path is not None else DEFAULT_PRICES
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise PriceError(f"cannot read price file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise PriceError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise PriceError(f"{path}: a price file is a mapping with gpu_prices, api_prices and overheads")
    try:
        return PriceBook.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise PriceError(f"{path}: {where}: {err['msg']}") from None
