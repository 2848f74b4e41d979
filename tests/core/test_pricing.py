"""The operator's price table: parsing, its errors, and the cost of one call."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tooltrail.core.messages import Usage
from tooltrail.core.pricing import ModelPrice, estimate_cost, parse_prices
from tooltrail.settings import Settings


def test_a_price_table_is_read_from_json() -> None:
    prices = parse_prices('{"m": {"input": 3, "output": 15, "cached_input": 0.3}}')
    assert prices == {"m": ModelPrice(input=3, output=15, cached_input=0.3)}
    assert parse_prices(None) == parse_prices("  ") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m=1:2", "is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"m": {"input": 1}}', "entry 'm' is not .*output: Field required"),
        ('{"m": {"input": -1, "output": 1}}', "entry 'm' .*greater than or equal to 0"),
        ('{"m": {"input": 1, "output": 1, "cache_read": 1}}', "cache_read: Extra inputs"),
        ('{"m": 3}', "entry 'm' is not"),
    ],
)
def test_a_wrong_table_says_which_entry_and_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prices(text)


def test_the_setting_refuses_a_wrong_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRAIL_MODEL_PRICES", '{"m": {"input": "free"}}')
    with pytest.raises(ValidationError, match="TOOLTRAIL_MODEL_PRICES entry 'm'"):
        Settings()
    monkeypatch.setenv("TOOLTRAIL_MODEL_PRICES", '{"m": {"input": 1, "output": 2}}')
    assert Settings().model_price_table() == {"m": ModelPrice(input=1, output=2)}


def test_cost_prices_cache_reads_writes_and_output_apart() -> None:
    prices = {"m": ModelPrice(input=3, output=15, cached_input=0.3, cache_write=3.75)}
    usage = Usage(
        input_tokens=1000, output_tokens=100, cache_read_tokens=500, cache_write_tokens=200
    )
    expected = (300 * 3 + 500 * 0.3 + 200 * 3.75 + 100 * 15) / 1_000_000
    assert estimate_cost(prices, "m", usage) == pytest.approx(expected)
    # Unset cache prices are the input price.
    plain = {"m": ModelPrice(input=2, output=4)}
    assert estimate_cost(plain, "m", usage) == pytest.approx((1000 * 2 + 100 * 4) / 1_000_000)


def test_a_model_without_a_price_has_no_cost() -> None:
    assert estimate_cost({}, "m", Usage(input_tokens=5)) is None
    assert estimate_cost({"m": ModelPrice(input=1, output=1)}, None, Usage()) is None
