"""Text PostgreSQL refuses never costs a turn its trail (issue 22, finding 1).

A model chooses call ids and tool names; tools read binary files. PostgreSQL refuses a NUL
byte anywhere in text or JSONB, and a string over a ``varchar(255)``; SQLite takes both. Every
test here runs on both databases (``db_url``) on a real Temporal server: the turn completes,
the trail in SQL says so, and what was stored reads back exactly as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from tests.conftest import StackFactory
from tests.support.cli_runner import run_cli
from tooltrail import CircuitBreaker, Host, RunConfig, ToolCall, tool
from tooltrail.core.text import not_available
from tooltrail.db.encoding import decode_json, decode_text, encode_json, encode_text, fit_name
from tooltrail.db.orm import ToolHealthRow
from tooltrail.errors import ConfigurationError
from tooltrail.llm.scripted import ScriptedModel, text_response, tool_call_response

BINARY = "PK\x03\x04\x00\x00binary\x00tail"
LONG_ID = "call-" + "x" * 400


@tool
def read_binary(path: str, size: int = 0) -> str:
    """Return a file's bytes as text (NUL bytes included)."""
    return BINARY + "\x00" * size


def nul_texts() -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(["\x00", "a", "$", "t", ":", "é", "h", "j", "s", "o", "n"]))


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(nul_texts(), inner, max_size=3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | nul_texts(), containers, max_leaves=12
)


@given(json_values)
def test_json_encoding_round_trips_and_never_holds_nul(value: Any) -> None:
    encoded = encode_json(value)
    assert "\\u0000" not in json.dumps(encoded)
    assert decode_json(json.loads(json.dumps(encoded))) == value


@given(nul_texts())
def test_text_encoding_round_trips_and_never_holds_nul(value: str) -> None:
    assert "\x00" not in encode_text(value)
    assert decode_text(encode_text(value)) == value


@given(st.text(min_size=250, max_size=300) | nul_texts())
def test_a_name_that_does_not_fit_gets_a_unique_stand_in(value: str) -> None:
    fitted = fit_name(value, 255)
    assert len(fitted) <= 255 and "\x00" not in fitted
    if len(value) <= 255 and "\x00" not in value and not value.startswith("$tt:h:"):
        assert fitted == value  # it fits: kept as it is
    else:
        # A stand-in, distinct from any other value's (here: one character longer).
        assert fitted != value and fitted.startswith("$tt:h:")
        assert fitted != fit_name(value + "!", 255)


async def test_nul_bytes_and_long_ids_are_stored_losslessly(
    stack: StackFactory, db_url: str, tmp_path: Path
) -> None:
    calls = [
        ToolCall(LONG_ID, "read_binary", {"path": "a\x00b"}),
        ToolCall("big\x00", "read_binary", {"path": "big", "size": 300_000}),
        ToolCall("c3", "no-such-tool-" + "n" * 400, {"k\x00": "\x00"}),
    ]
    async with stack(Host([read_binary]), database_url=db_url) as tt:
        turn = await tt.run_turn(calls, session_id="hostile-1", config=RunConfig())
        record = await tt.store.turn(turn.turn_id)
        events = await tt.audit(turn.turn_id)
        memory = await tt.memory("hostile-1")
    first, big, unknown = turn.results
    assert (first.is_error, first.output) == (False, BINARY)
    assert not big.is_error and big.output == BINARY + "\x00" * 300_000
    assert unknown.output == not_available(calls[2].name)  # quoted up to QUOTE_CHARS
    assert record is not None and record.status == "completed"
    received = [(e.tool_call_id, e.tool_name) for e in events if e.kind == "tool_call_received"]
    assert received == [(c.id, c.name) for c in calls]
    posts = {e.tool_call_id: e.payload for e in events if e.kind == "tool_post"}
    assert posts[LONG_ID]["output"] == BINARY
    assert posts["big\x00"]["output"] == big.output, "the stored large output, NULs and all"
    assert any("\x00" in m.content for m in memory)

    shown = run_cli(["audit", "show", turn.turn_id, "--json", "--database-url", db_url], tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [e["tool_call_id"] for e in data["events"] if e["kind"] == "tool_call_received"] == [
        c.id for c in calls
    ]
    received_first = next(e for e in data["events"] if e["tool_call_id"] == LONG_ID)
    assert received_first["payload"]["input"] == {"path": "a\x00b"}


async def test_an_agent_run_keeps_nul_outputs_and_long_ids(
    stack: StackFactory, db_url: str
) -> None:
    model = ScriptedModel(
        [
            tool_call_response((LONG_ID, "read_binary", {"path": "x\x00y"})),
            text_response("read it"),
        ]
    )
    async with stack(Host([read_binary], model=model), database_url=db_url) as tt:
        result = await tt.run_agent("read the file", session_id="hostile-agent")
    assert result.text == "read it"
    tool_message = model.requests[1].messages[-1]
    assert tool_message.role == "tool" and tool_message.content == BINARY


async def test_session_and_turn_ids_the_database_cannot_hold_are_refused_at_start(
    stack: StackFactory, db_url: str
) -> None:
    call = [ToolCall("c", "read_binary", {"path": "p"})]
    async with stack(Host([read_binary]), database_url=db_url) as tt:
        for options in (
            {"session_id": "s" * 256},
            {"session_id": "a\x00b"},
            {"session_id": "ok", "turn_id": "t" * 300},
        ):
            with pytest.raises(ConfigurationError, match="ids must be 1 to 255 characters"):
                await tt.start_turn(call, **options)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="session_id"):
            await tt.start_agent("hi", session_id="x" * 300)
        turn = await tt.run_turn(call, session_id="s" * 255)
    assert turn.results[0].output == BINARY


async def test_the_breaker_keeps_health_for_names_its_column_cannot_hold(
    stack: StackFactory, db_url: str
) -> None:
    long_name, nul_name = "y" * 300, "a\x00b"
    host = Host([read_binary], circuit_breaker=CircuitBreaker(failure_threshold=2))
    async with stack(host, database_url=db_url) as tt:
        turn = await tt.run_turn(
            [ToolCall("c1", long_name, {}), ToolCall("c2", nul_name, {})],
            session_id="hostile-health",
            advertised=["read_binary", long_name, nul_name],
        )
        async with tt.store.engine.connect() as conn:
            names = (await conn.execute(select(ToolHealthRow.tool_name))).scalars().all()
    assert all(r.is_error for r in turn.results)
    assert len(names) == 2 and all(len(n) <= 255 and "\x00" not in n for n in names)
