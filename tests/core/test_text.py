"""Pure unit tests of tooltrail.core.text: the exact model-visible texts and shared helpers."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from tooltrail.core.results import ImagePart, TextPart
from tooltrail.core.text import (
    MEMORY_FIELD_LIMIT,
    QUOTE_CHARS,
    canonical_json,
    duplicate_call_id,
    invalid_arguments,
    not_available,
    not_found,
    panicked,
    render_text,
    stable_hash,
    trajectory,
    trunc,
)

# -- canonical JSON (pipeline spec §0) -------------------------------------------------------


def test_canonical_json_sorts_keys_at_every_level_and_is_compact():
    value = {"b": 1, "a": {"z": [3, {"y": 2, "x": 1}], "c": None}}
    assert canonical_json(value) == '{"a":{"c":null,"z":[3,{"x":1,"y":2}]},"b":1}'


def test_canonical_json_keeps_non_ascii():
    assert canonical_json({"city": "Zürich", "emoji": "✓"}) == '{"city":"Zürich","emoji":"✓"}'


def test_canonical_json_key_order_does_not_matter():
    assert canonical_json({"a": 1, "b": 2}) == canonical_json({"b": 2, "a": 1})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("x", '"x"'), (1, "1"), (1.5, "1.5"), (True, "true"), (None, "null"), ([], "[]"), ({}, "{}")],
)
def test_canonical_json_scalars(value, expected):
    assert canonical_json(value) == expected


# -- render_text -----------------------------------------------------------------------------


def test_render_text_returns_text_unchanged():
    assert render_text("  as is\n") == "  as is\n"
    assert render_text("") == ""


def test_render_text_joins_multipart_with_newlines():
    parts: list[TextPart | ImagePart] = [
        TextPart("first"),
        ImagePart("image/png", "AAAA"),
        TextPart(text="last"),
    ]
    assert render_text(parts) == "first\n[image: image/png]\nlast"


def test_render_text_single_text_part_equals_its_text():
    assert render_text([TextPart("only")]) == "only"


def test_render_text_of_no_parts_is_empty():
    assert render_text([]) == ""


def test_render_text_image_does_not_include_the_bytes():
    rendered = render_text([ImagePart(media_type="image/jpeg", data_b64="c2VjcmV0")])
    assert rendered == "[image: image/jpeg]"
    assert "c2VjcmV0" not in rendered


# -- stable_hash (pipeline spec §0 rule 4) ---------------------------------------------------


def test_stable_hash_is_a_64_bit_blake2b_hex_digest():
    assert stable_hash("hello") == "a7b6eda801e5347d"
    assert stable_hash("hello") == hashlib.blake2b(b"hello", digest_size=8).hexdigest()


def test_stable_hash_encodes_utf8():
    text = "héllo ✓"
    assert stable_hash(text) == "a7bbf64737b07423"
    assert stable_hash(text) == hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def test_stable_hash_of_empty_text_is_none():
    assert stable_hash("") is None


def test_stable_hash_distinguishes_texts():
    assert stable_hash("a") != stable_hash("b")
    assert len(stable_hash("a") or "") == 16


def test_stable_hash_is_the_same_in_another_process():
    # The built-in hash() is salted per process; stable_hash must not be.
    code = "from tooltrail.core.text import stable_hash; print(stable_hash('hello'))"
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(done.stdout.strip())
    assert outputs == {"a7b6eda801e5347d"}


# -- trunc and the trajectory entry (pipeline spec §5) ---------------------------------------


def test_memory_field_limit_is_500():
    assert MEMORY_FIELD_LIMIT == 500


def test_trunc_cuts_and_marks_with_an_ellipsis():
    assert trunc("hello world", 5) == "hello…"
    assert trunc("hello world", 5)[-1] == "\u2026"


def test_trunc_counts_code_points_not_bytes():
    assert trunc("héllo", 3) == "hél…"


def test_trunc_keeps_text_at_or_under_the_limit():
    assert trunc("hello", 5) == "hello"
    assert trunc("hell", 5) == "hell"
    assert trunc("", 5) == ""


def test_trunc_default_limit_is_500():
    assert trunc("x" * 500) == "x" * 500
    cut = trunc("é" * 501)
    assert cut == "é" * 500 + "…"
    assert len(cut) == 501


def test_trajectory_format():
    assert trajectory("echo", '{"text":"hi"}', "hi") == 'tool=echo; input={"text":"hi"}; result=hi'


def test_trajectory_truncates_input_and_result_separately():
    entry = trajectory("t", "i" * 600, "r" * 501)
    assert entry == f"tool=t; input={'i' * 500}…; result={'r' * 500}…"


def test_trajectory_keeps_fields_at_the_limit():
    entry = trajectory("t", "i" * 500, "r" * 500)
    assert entry == f"tool=t; input={'i' * 500}; result={'r' * 500}"
    assert "…" not in entry


# -- unknown tools (pipeline spec §3.1, §3.2) ------------------------------------------------


def test_not_available():
    assert not_available("ghost") == "tool 'ghost' is not available"


def test_long_names_and_ids_are_quoted_up_to_a_limit():
    name = "é" * (QUOTE_CHARS + 1)
    assert (
        not_available(name)
        == f"tool '{name[:QUOTE_CHARS]}... ({QUOTE_CHARS + 1} characters)' is not available"
    )
    assert not_available(name, None) == f"tool '{name}' is not available"
    assert not_available(name, 0) == f"tool '... ({QUOTE_CHARS + 1} characters)' is not available"
    assert not_available("x" * QUOTE_CHARS) == f"tool '{'x' * QUOTE_CHARS}' is not available"
    assert duplicate_call_id("i" * 1000).startswith(
        "duplicate tool_call_id '" + "i" * QUOTE_CHARS + "... (1000"
    )


def test_not_found_lists_sorted_names():
    assert not_found("x", {"b", "a"}) == "Tool not found: x. Available: a, b"


def test_not_found_empty_registry():
    assert not_found("x", []) == "Tool not found: x. Available: none registered"


def test_not_found_accepts_any_iterable():
    assert not_found("x", iter(["b", "a"])) == "Tool not found: x. Available: a, b"


def test_not_found_truncates_after_ten_names():
    names = [f"t{i:02d}" for i in range(13, 0, -1)]
    assert not_found("x", names) == (
        "Tool not found: x. Available: "
        "t01, t02, t03, t04, t05, t06, t07, t08, t09, t10... (and 3 more)"
    )


def test_not_found_exactly_ten_names_is_not_truncated():
    names = [f"t{i:02d}" for i in range(1, 11)]
    text = not_found("x", names)
    assert text == "Tool not found: x. Available: " + ", ".join(names)
    assert "more" not in text


def test_not_found_eleven_names_says_one_more():
    names = [f"t{i:02d}" for i in range(1, 12)]
    assert not_found("x", names).endswith("t10... (and 1 more)")


def test_not_found_sorts_in_plain_string_order():
    assert not_found("x", ["tool_2", "tool_10", "Zed"]) == (
        "Tool not found: x. Available: Zed, tool_10, tool_2"
    )


# -- panics and invalid arguments (pipeline spec §2.3, CONTRACT) -----------------------------


def test_panicked_with_message():
    assert panicked("p", "x") == "tool 'p' panicked: x"


def test_panicked_without_message():
    assert panicked("p", "") == "tool 'p' panicked (unknown payload)"


def test_invalid_arguments():
    assert invalid_arguments("Expecting value") == "invalid arguments: Expecting value"


def test_the_one_canonical_encoder_refuses_nan_and_the_infinities() -> None:
    # Decided once (issue 28): JSON has no NaN, so nothing tooltrail hashes or signs may hold
    # one. Every other canonical form is this text (bytes: its UTF-8).
    from tooltrail.core.signatures import canonical_arguments
    from tooltrail.tools import canonical_json as snapshot_bytes

    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    assert snapshot_bytes({"b": 1, "a": "é"}) == canonical_json({"b": 1, "a": "é"}).encode()
    assert canonical_arguments({"b": [1.5]}) == canonical_json({"b": [1.5]}).encode()
    for bad in (float("nan"), float("inf"), float("-inf")):
        for encode in (canonical_json, snapshot_bytes, canonical_arguments):
            with pytest.raises(ValueError, match="not JSON compliant"):
                encode({"x": [bad]})


def test_holds_non_finite_looks_everywhere_without_recursion() -> None:
    from tooltrail.core.text import holds_non_finite

    assert not holds_non_finite({"a": [1, 2.5, "NaN", None, {"b": 1e308}]})
    assert holds_non_finite({"a": [{"b": float("nan")}]})
    assert holds_non_finite([[[float("-inf")]]])
    deep: list[object] = [float("inf")]
    for _ in range(100_000):
        deep = [deep]
    assert holds_non_finite(deep)


# -- arguments nested too deep -----------------------------------------------------------------


def _nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"text": "bottom"}
    for _ in range(depth):
        value = {"text": "level", "inner": value}
    return value


@pytest.mark.parametrize("depth", [0, 1, 63, 64, 65, 66, 150, 900])
def test_text_nesting_agrees_with_the_parsed_value_wherever_both_can_read(depth: int) -> None:
    import json

    from tooltrail.core.text import argument_problem, nesting_exceeds, text_nesting_exceeds

    for value in (_nested(depth), {"list": json.loads("[" * depth + "]" * depth or "[]")}):
        text = json.dumps(value)
        # The text says "too deep" only of what is too deep; what it lets through parses,
        # and then the parsed value's check decides.
        if text_nesting_exceeds(text):
            assert nesting_exceeds(json.loads(text))
        else:
            assert argument_problem(json.loads(text), 10**9) in (
                None,
                "invalid arguments: nested deeper than 64 levels",
            )


def test_text_nesting_reads_brackets_outside_strings_only() -> None:
    from tooltrail.core.text import text_nesting_exceeds

    assert not text_nesting_exceeds('{"a": "' + "[" * 500 + '"}')
    assert not text_nesting_exceeds('{"a": "\\"' + "{" * 500 + '"}')
    assert text_nesting_exceeds('{"a": "\\\\", "b": ' + "[" * 70 + "]" * 70 + "}")
    # Past Python's parser, valid or cut off: read without parsing, without recursion.
    assert text_nesting_exceeds("[" * 100_000 + "]" * 100_000)
    assert text_nesting_exceeds('{"a": ' * 100_000)
    assert not text_nesting_exceeds("[]" * 100_000)


def test_arguments_too_deep_for_the_payloads_travel_as_text_the_turn_refuses() -> None:
    import json

    from tooltrail.core.results import ToolCall
    from tooltrail.core.text import encodable_call, json_prefix, text_nesting_exceeds

    shallow = ToolCall("c", "echo", _nested(63))  # its "bottom" is 64 levels deep
    assert encodable_call(shallow) is shallow
    # Deep, but json.dumps can: the whole text.
    deep = encodable_call(ToolCall("c", "echo", _nested(200)))
    assert json.loads(deep.arguments) == _nested(200)
    # Deeper than json.dumps can go (a RecursionError before): cut past the limit.
    deepest = encodable_call(ToolCall("c", "echo", _nested(100_000)))
    assert isinstance(deepest.arguments, str) and len(deepest.arguments) < 2_000
    assert deepest.arguments.startswith('{"text": "level", "inner": {"text": "level"')
    assert text_nesting_exceeds(deepest.arguments)
    assert json_prefix([[1, {"k": None}], 2]) == '[[1, {"k": null}], 2]'
    assert json_prefix([[[[]]]], limit=1) == "[[["
