"""The price function: cached and cache-written input at their prices, exact nano-USD.

Expected amounts are computed here in exact fractions from the prices as written, so a
float error in the gateway's arithmetic (0.3 x 7 x 1000 = 2099.9999...) shows.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from gateway.accounts.catalog import Model
from gateway.accounts.orgs import validate_policy
from gateway.calls.settlement import Ending, settle_amounts
from gateway.config.settings import ModelConfig
from gateway.errors import GatewayError
from gateway.providers.base import Usage

IN, OUT, READ, WRITE = "3", "15", "0.3", "3.75"


def model(read: str | None = READ, write: str | None = WRITE) -> Model:
    return Model(
        ModelConfig(
            "m",
            "p",
            "u",
            input_usd_per_mtok=float(IN),
            output_usd_per_mtok=float(OUT),
            cache_read_usd_per_mtok=None if read is None else float(read),
            cache_write_usd_per_mtok=None if write is None else float(write),
        )
    )


def exact(plain: int, cached: int, written: int, out: int, read: str, write: str) -> int:
    usd_x_1e6 = (
        plain * Fraction(IN)
        + cached * Fraction(read)
        + written * Fraction(write)
        + out * Fraction(OUT)
    )
    return math.ceil(usd_x_1e6 * 1000)


def test_without_cache_tokens_the_price_is_input_and_output() -> None:
    assert model().cost_nanos(1000, 100) == 1000 * 3000 + 100 * 15000
    assert model().cost_nanos(0, 0) == 0


@pytest.mark.parametrize(("read", "write"), [(READ, WRITE), (None, None), (READ, None)])
def test_cached_and_written_tokens_at_their_prices_absent_at_input(
    read: str | None, write: str | None
) -> None:
    priced = model(read, write)
    for prompt in range(0, 120, 7):
        for cached in range(0, prompt + 1, 5):
            for written in range(0, prompt - cached + 1, 3):
                want = exact(prompt - cached - written, cached, written, 9, read or IN, write or IN)
                assert priced.cost_nanos(prompt, 9, cached, written) == want


def test_a_cache_price_of_zero_is_a_price() -> None:
    free = model(read="0", write="0")
    assert free.cost_nanos(100, 0, 60, 40) == 0
    assert free.cost_nanos(100, 0, 60, 0) == 40 * 3000


def test_fractional_prices_are_exact_and_rounded_up_once() -> None:
    """In floats, 10 tokens at 3 and 9 cached at 0.3 (USD per Mtok) make
    32700.000000000004 nano-USD, whose ceiling bills one nano more than the price."""
    assert model().cost_nanos(19, 0, 9) == 10 * 3000 + 9 * 300
    tiny = Model(ModelConfig("t", "p", "u", input_usd_per_mtok=0.0003, output_usd_per_mtok=0.0075))
    assert tiny.cost_nanos(1, 0) == 1  # 0.3 nano-USD, rounded up
    assert tiny.cost_nanos(10, 0) == 3
    assert tiny.cost_nanos(7, 10) == 78  # 2.1 + 75, rounded up once


def test_cached_above_the_prompt_is_clamped_to_the_prompt() -> None:
    """A faulty upstream reporting more cached than prompt tokens: every prompt token is
    priced as cached, none twice, none negative."""
    priced = model()
    assert priced.cost_nanos(10, 0, 50) == 10 * 300
    assert priced.cost_nanos(10, 0, 4, 50) == 4 * 300 + 6 * 3750
    assert priced.cost_nanos(10, 0, 10, 5) == 10 * 300
    assert priced.cost_nanos(10, 2, -5, -1) == 10 * 3000 + 2 * 15000
    assert priced.cost_nanos(-3, -2) == 0


def test_settlement_prices_the_reported_usage_and_never_passes_the_reservation() -> None:
    priced = model()
    usage = Usage(prompt_tokens=100, completion_tokens=10, cached_tokens=80)
    want = exact(20, 80, 0, 10, READ, WRITE)
    row = settle_amounts(
        Ending.USAGE,
        model=priced,
        reserved_nanos=10**9,
        prompt_estimate=500,
        usage=usage,
        live=True,
    )
    assert (row.cap_nanos, row.billed_nanos) == (want, want)
    # writes priced above input could pass a reservation made at the input price: capped
    written = Usage(prompt_tokens=100, completion_tokens=0, cache_write_tokens=100)
    reserved = priced.cost_nanos(100, 0)
    row = settle_amounts(
        Ending.USAGE,
        model=priced,
        reserved_nanos=reserved,
        prompt_estimate=100,
        usage=written,
        live=True,
    )
    assert row.cap_nanos == row.billed_nanos == reserved < priced.cost_nanos(100, 0, 0, 100)


def test_usage_reads_and_writes_the_cache_details() -> None:
    report = {
        "prompt_tokens": 30,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 20, "cache_write_tokens": 5},
    }
    usage = Usage.reported(report)
    assert usage == Usage(30, 4, 34, cached_tokens=20, cache_write_tokens=5)
    assert Usage.reported(usage.as_dict()) == usage
    assert "prompt_tokens_details" not in Usage(3, 1).as_dict()
    # a detail that is not a count: the usage is still reported, the tokens plain input
    for details in (None, {"cached_tokens": None}, {"cached_tokens": "x"}, "x", {}):
        odd = Usage.reported({"prompt_tokens": 3, "prompt_tokens_details": details})
        assert odd == Usage(3)


def test_byok_prices_may_carry_cache_prices() -> None:
    both = {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}
    validate_policy({"byok_pricing": {"*": both}})
    validate_policy({"byok_pricing": {"*": {**both, "cache_read_usd_per_mtok": 0.1}}})
    validate_policy({"byok_pricing": {"*": {**both, "cache_write_usd_per_mtok": 1.25}}})
    for bad in (
        {**both, "cache_read_usd_per_mtok": -1},
        {**both, "cache_read_usd_per_mtok": True},
        {**both, "cache_price": 1},
        {"input_usd_per_mtok": 1, "cache_read_usd_per_mtok": 1},
    ):
        with pytest.raises(GatewayError) as refused:
            validate_policy({"byok_pricing": {"*": bad}})
        assert refused.value.param == "byok_pricing"


def test_a_byok_price_without_cache_prices_prices_cached_tokens_at_its_input() -> None:
    """Never at the catalog's cache prices: they are the platform's, not the org's."""
    byok = model().priced_at(1, 2)
    assert byok.cost_nanos(100, 0, 100) == 100 * 1000
    byok = model().priced_at(1, 2, 0.5, 1.5)
    assert byok.cost_nanos(100, 0, 60, 40) == 60 * 500 + 40 * 1500
