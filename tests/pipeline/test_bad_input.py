"""Bad model output on a real server: every turn ends with one clear result per call.

A model may ask for any name with any arguments. Whatever it sends, the turn must finish (no
failed workflow, no workflow task stuck retrying) with exactly one result per call, in the
model's order: a normal result, or a soft error whose text says what was wrong.

The property runs under Hypothesis with pytest-asyncio's native support for async ``@given``
tests: every example runs on the session's event loop, against one worker that lives for the
module (a worker per example would cost seconds each).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tooltrail import Host, RunConfig, ToolCall, ToolDispatchResult, Tooltrail, TurnError, tool
from tooltrail.core.text import holds_non_finite, not_available
from tooltrail.db.migrate import upgrade
from tooltrail.db.store import AuditStore
from tooltrail.runtime.worker import build_worker
from tooltrail.tools.scratch import ScratchDirs

TURN_TIMEOUT_S = 30.0
"""A turn that has no result after this long counts as stuck."""

runs: Counter[str] = Counter()


@tool
async def echo(text: str) -> str:
    """Return the text."""
    runs["echo"] += 1
    return text


@tool
async def double(n: int) -> str:
    """Return twice the number."""
    runs["double"] += 1
    return str(2 * n)


TOOLS = {"echo", "double"}
PARAMETERS = {"echo": ("text", str), "double": ("n", int)}
"""Each tool's one parameter and the type it always takes."""
REFUSALS = {
    "echo": {"not a valid string"},
    "double": {"not a valid integer", "not a finite number"},
}
"""What each tool's parameter model may say of a value of another type."""


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def bad_input_db(request: pytest.FixtureRequest) -> str:
    """The module's database: every bad input runs on SQLite and on PostgreSQL, which
    refuses text SQLite takes (NUL bytes, strings over a column's length)."""
    if request.param == "sqlite":
        return "sqlite"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="module")
async def tt(
    bad_input_db: str, temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Tooltrail]:
    """One worker and client per database for the whole module, on the shared dev server."""
    base = tmp_path_factory.mktemp("bad-input")
    url = bad_input_db
    if url == "sqlite":
        url = f"sqlite:///{base / 'audit.db'}"
        await upgrade(url)
    store = AuditStore(url)
    host = Host([echo, double])
    task_queue = f"tq-bad-input-{uuid.uuid4()}"
    client = temporal_env.client
    try:
        async with build_worker(
            client, host, task_queue=task_queue, store=store, scratch=ScratchDirs(base / "scratch")
        ):
            yield Tooltrail(client, host, task_queue=task_queue, store=store)
    finally:
        await store.close()


# -- what a model might send -------------------------------------------------------------------

HUGE = 100_000
MAX_SAFE_DEPTH = 150
"""The property's deepest arguments; deeper ones are ``FORMERLY_STUCK`` cases below."""

tool_names = st.sampled_from(sorted(TOOLS))
odd_names = st.one_of(
    st.sampled_from(
        ["", " ", "Echo", "echo ", " echo", "ECHO", "échö", "工具", "🔧", "\x00", "\n"]
    ),
    st.text(max_size=40),
    st.text(st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), min_size=1, max_size=20),
    st.integers(200, 5_000).map(lambda n: "n" * n),
)


@st.composite
def names(draw: st.DrawFn) -> str:
    """Two calls in three name a real tool, so most arguments get as far as being parsed."""
    return draw(tool_names) if draw(st.integers(0, 2)) < 2 else draw(odd_names)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"text": "bottom"}
    for _ in range(depth):
        value = {"text": "level", "inner": value}
    return value


# Arguments as the mapping the model client already parsed.
dict_arguments = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=50)}),
    st.fixed_dictionaries({"n": st.integers(-(2**70), 2**70)}),
    st.fixed_dictionaries({"text": json_values}),
    st.fixed_dictionaries({"n": json_values}),
    st.dictionaries(st.text(max_size=15), json_values, max_size=5),
    st.fixed_dictionaries({"text": st.text(max_size=20)}, optional={"extra": json_values}),
    st.integers(1, MAX_SAFE_DEPTH).map(nested),
)

# Arguments as the model's raw JSON text.
raw_arguments = st.one_of(
    dict_arguments.map(json.dumps),
    st.lists(json_values, max_size=5).map(json.dumps),
    json_scalars.map(json.dumps),
    st.sampled_from(
        [
            "",
            "   ",
            "\n\t",
            "{",
            "}",
            "{}",
            "[]",
            "null",
            '{"text": }',
            '{"text": "unterminated',
            "{'text': 'single quotes'}",
            '{"text": "a", "text": "b"}',
            '{"text": "\\u0000"}',
            '{"n": NaN}',
            '{"n": Infinity}',
            '{"n": -Infinity}',
            '{"n": 1e400}',
            '{"text": "a", "x": NaN}',
            '{"text": "ok"} trailing',
            "\ufeff{}",
        ]
    ),
    st.integers(1, MAX_SAFE_DEPTH).map(lambda depth: json.dumps(nested(depth))),
    st.text(max_size=200),
    st.text(st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), max_size=50),
)

huge_arguments = st.sampled_from(
    [
        json.dumps({"text": "x" * HUGE}),
        json.dumps({"text": "é" * (HUGE // 2)}),
        "g" * HUGE,
        json.dumps(["y" * HUGE]),
        json.dumps({"n": 1, "padding": "p" * HUGE}),
    ]
) | st.just({"text": "z" * HUGE})

arguments = st.one_of(dict_arguments, raw_arguments)


@st.composite
def batches(draw: st.DrawFn) -> list[ToolCall]:
    """Up to 6 calls, plus at most one with ~100 KB of arguments (the turn stays < 2 MB)."""
    pairs = draw(st.lists(st.tuples(names(), arguments), max_size=6))
    if draw(st.booleans()):
        position = draw(st.integers(0, len(pairs)))
        pairs.insert(position, (draw(names()), draw(huge_arguments)))
    ids = draw(
        st.lists(st.text(max_size=20), min_size=len(pairs), max_size=len(pairs), unique=True)
    )
    return [
        ToolCall(id=call_id, name=name, arguments=args)
        for call_id, (name, args) in zip(ids, pairs, strict=True)
    ]


# -- what must come back -----------------------------------------------------------------------

SOFT_PREFIXES = ("tool '", "invalid arguments: ", "guardrail violation: ")


def expected_outcome(call: ToolCall) -> tuple[str, str]:
    """``(kind, text)``: ``exact``/``prefix`` of a soft error, or ``tool`` (ran or refused)."""
    if call.name not in TOOLS:
        return "exact", not_available(call.name)  # the name quoted up to QUOTE_CHARS
    arguments = call.arguments
    # A dict's NaN or infinity never reaches the workflow (the data converter sends null);
    # raw text keeps it, and since tooltrail-finite-arguments the turn refuses it.
    from_text = isinstance(arguments, str)
    if isinstance(arguments, str):
        if not arguments.strip():
            return "tool", ""
        try:
            parsed = json.loads(arguments)
        except RecursionError:
            # Nested past Python's parser: since tooltrail-deep-arguments the turn says so,
            # not "not valid JSON".
            return "exact", "invalid arguments: nested deeper than 64 levels"
        except ValueError:
            return "prefix", "invalid arguments: "
        if not isinstance(parsed, dict):
            return "prefix", "invalid arguments: expected a JSON object"
        arguments = parsed
    if depth(arguments) > 64:
        return "exact", "invalid arguments: nested deeper than 64 levels"
    try:
        json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return (
            "exact",
            "invalid arguments: contains text that is not valid Unicode (a lone surrogate)",
        )
    if from_text and holds_non_finite(arguments):
        return "exact", "invalid arguments: NaN and Infinity are not JSON numbers"
    return "tool", ""


def depth(value: Any) -> int:
    """Nesting depth of dicts and lists (the workflow refuses more than 64)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def parsed_arguments(call: ToolCall) -> dict[str, Any]:
    if isinstance(call.arguments, dict):
        return call.arguments
    return json.loads(call.arguments) if call.arguments.strip() else {}


def check_result(call: ToolCall, result: ToolDispatchResult) -> None:
    __tracebackhide__ = True
    assert result.tool_call_id == call.id
    kind, text = expected_outcome(call)
    output = result.output
    assert isinstance(output, str), f"{call.name!r}: multipart output {output!r}"
    if kind == "exact":
        assert (result.is_error, output) == (True, text)
    elif kind == "prefix":
        assert result.is_error and output.startswith(text), (call.arguments, output)
    elif result.is_error:
        # The tool was reached. echo and double have no guardrail of their own: only their
        # parameter model may refuse, naming its one field, and only a value of the wrong type.
        field, accepted = PARAMETERS[call.name]
        arguments = parsed_arguments(call)
        if field not in arguments:
            assert output == f"guardrail violation: {field}: field required", (call, output)
        else:
            assert type(arguments[field]) is not accepted, (call, output)
            assert output in {f"guardrail violation: {field}: {r}" for r in REFUSALS[call.name]}, (
                call,
                output,
            )
    else:
        value = parsed_arguments(call)["text" if call.name == "echo" else "n"]
        expected = value if call.name == "echo" else str(2 * int(value))
        assert output == expected


async def workflow_task_failures(handle: WorkflowHandle[Any, Any]) -> list[str]:
    history = await handle.fetch_history()
    return [
        event.workflow_task_failed_event_attributes.failure.message
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def finish(tt: Tooltrail, calls: list[ToolCall], config: RunConfig) -> list[Any]:
    """Run a turn to its end, or fail the test saying why it did not end.

    A failed workflow task means the turn is stuck (Temporal retries it forever): that fails
    the test at once, and the turn is terminated so it stops costing the worker. A turn that
    neither finishes nor fails a task within ``TURN_TIMEOUT_S`` fails the test too.
    """
    handle = await tt.start_turn(calls, session_id=f"s-{uuid.uuid4()}", config=config)
    workflow = handle.workflow_handle
    waiting = asyncio.ensure_future(handle.result())
    deadline = asyncio.get_running_loop().time() + TURN_TIMEOUT_S
    problem = None
    try:
        while not waiting.done():
            await asyncio.wait({waiting}, timeout=0.5)
            if waiting.done():
                break
            failures = await workflow_task_failures(workflow)
            if failures:
                problem = f"its workflow task failed (the turn is stuck): {failures[0]}"
            elif asyncio.get_running_loop().time() > deadline:
                problem = f"no result within {TURN_TIMEOUT_S:.0f} s"
            if problem is not None:
                await workflow.terminate(f"stuck turn (test_bad_input): {problem}")
                break
    finally:
        if not waiting.done():
            waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
    if problem is None:
        try:
            results = list(waiting.result().results)
        except TurnError as exc:
            problem = f"the turn failed: {type(exc).__name__}: {exc}"
        else:
            await check_trail(tt, handle.turn_id, calls, results)
            return results
    pytest.fail(f"turn {handle.turn_id} did not finish cleanly: {problem}")


def has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(has_float(item) for item in value.values())
    if isinstance(value, list):
        return any(has_float(item) for item in value)
    return False


async def check_trail(
    tt: Tooltrail, turn_id: str, calls: list[ToolCall], results: list[ToolDispatchResult]
) -> None:
    """The trail in SQL says what the caller got: the turn completed, every call received,
    every result that ran recorded exactly (NUL bytes and long ids included)."""
    __tracebackhide__ = True
    record = await tt.store.turn(turn_id)
    assert record is not None and record.status == "completed", record
    events = await tt.audit(turn_id)
    received = [(e.tool_call_id, e.tool_name) for e in events if e.kind == "tool_call_received"]
    assert received == [(c.id, c.name) for c in calls]
    receipts = [e for e in events if e.kind == "tool_call_received"]
    for event, call in zip(receipts, calls, strict=True):
        if "input_bytes" not in event.payload:
            recorded = event.payload["input"]
            # Deep inputs are kept as JSON text; PostgreSQL's JSONB keeps numbers as decimals,
            # so a float may read back as an equal-looking integer: compare the rest exactly.
            if type(recorded) is type(call.arguments) and not has_float(call.arguments):
                assert recorded == call.arguments
    posts = {e.tool_call_id: e.payload for e in events if e.kind == "tool_post"}
    for result in results:
        if result.tool_call_id in posts and not result.is_error:
            assert posts[result.tool_call_id]["output"] == result.output


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(calls=batches(), parallel=st.booleans())
@example(calls=[], parallel=False)
@example(
    calls=[ToolCall("a", "echo", {"text": "hi"}), ToolCall("b", "double", '{"n": 21}')],
    parallel=False,
)
@example(calls=[ToolCall("", "", ""), ToolCall(" ", "n" * 5000, "g" * HUGE)], parallel=True)
async def test_every_turn_finishes_with_one_clear_result_per_call(
    tt: Tooltrail, calls: list[ToolCall], parallel: bool
) -> None:
    config = RunConfig(dispatch="parallel" if parallel else "sequential")
    results = await finish(tt, calls, config)
    assert [r.tool_call_id for r in results] == [c.id for c in calls]
    for call, result in zip(calls, results, strict=True):
        check_result(call, result)


# Inputs the random search may miss, each its own turn so a failure names its input.
EDGE_CASES = {
    "nan-in-ignored-argument": ToolCall("c", "echo", '{"text": "a", "x": NaN}'),
    "nan-in-declared-argument": ToolCall("c", "double", '{"n": NaN}'),
    "infinity": ToolCall("c", "double", '{"n": Infinity}'),
    "overflowing-float": ToolCall("c", "double", '{"n": 1e400}'),
    "nul-escape": ToolCall("c", "echo", '{"text": "a\\u0000b"}'),
    "bom": ToolCall("c", "echo", '\ufeff{"text": "a"}'),
    "duplicate-keys": ToolCall("c", "echo", '{"text": "a", "text": "b"}'),
    "dict-arguments-nested-150": ToolCall("c", "echo", nested(MAX_SAFE_DEPTH)),
    "raw-json-nested-150": ToolCall("c", "echo", json.dumps(nested(MAX_SAFE_DEPTH))),
    # Past what json.dumps and json.loads can read: once "not valid JSON", now too deep.
    "dict-arguments-nested-100000": ToolCall("c", "echo", nested(HUGE)),
    "raw-json-nested-100000": ToolCall(
        "c", "echo", '{"text": "a", "x": ' + "[" * HUGE + "]" * HUGE + "}"
    ),
    "raw-json-cut-off-nested-100000": ToolCall("c", "echo", '{"text": "a", "x": ' + "[" * HUGE),
    "huge-echo": ToolCall("c", "echo", {"text": "x" * HUGE}),
    "huge-raw-garbage": ToolCall("c", "echo", "{" + "g" * HUGE),
    "huge-name": ToolCall("c", "n" * HUGE, {}),
    "unicode-name": ToolCall("c", "échö-🔧", {"text": "a"}),
    "empty-name": ToolCall("c", "", ""),
    # Text PostgreSQL refuses where SQLite takes it: NUL bytes, strings over a column.
    "nul-in-dict-argument": ToolCall("c", "echo", {"text": "bin\x00ary"}),
    "nul-in-argument-key": ToolCall("c", "echo", {"text": "a", "k\x00y": 1}),
    "nul-in-call-id": ToolCall("c\x00d", "echo", {"text": "a"}),
    "nul-in-unknown-name": ToolCall("c", "ec\x00ho", {"text": "a"}),
    "long-call-id": ToolCall("i" * 300, "echo", {"text": "a"}),
    "long-call-id-unknown-name": ToolCall("j" * 5000, "n" * 300, {}),
    "marker-lookalike": ToolCall(
        "c", "echo", {"text": "$tt:json:x", "m": {"$tt:nul": ["a", "b"]}, "$tt:columns": 1}
    ),
    "marker-lookalike-id": ToolCall("$tt:h:" + "0" * 32 + ":x", "$tt:h:y", {}),
}

# Inputs that once left the turn stuck (its workflow task failing forever) or made the client
# raise, each with what went wrong then; each now ends with a clear result.
FORMERLY_STUCK = {
    "5000-digit-integer": (
        ToolCall("c", "double", '{"n": 1' + "0" * 5000 + "}"),
        "json.loads raises ValueError (int max_str_digits), not JSONDecodeError: "
        "_parse_arguments lets it escape and the workflow task fails forever",
    ),
    "raw-json-nested-5000": (
        ToolCall("c", "echo", "[" * 5000 + "]" * 5000),
        "json.loads raises RecursionError: uncaught in _parse_arguments (stuck turn) and in "
        "Host.verdicts (start_turn raises in parallel mode)",
    ),
    "raw-json-nested-300": (
        ToolCall("c", "echo", json.dumps(nested(300))),
        "parses, but the activity input exceeds pydantic's serialization depth: stuck turn",
    ),
    "lone-surrogate-escape": (
        ToolCall("c", "echo", '{"text": "\\ud800"}'),
        "parses to a str with a lone surrogate that pydantic cannot serialize into the "
        "activity input: stuck turn",
    ),
    "dict-arguments-nested-250": (
        ToolCall("c", "echo", nested(250)),
        "the client encodes TurnInput but the worker cannot decode it (pydantic JSON "
        "recursion limit): 'Failed decoding arguments', stuck turn",
    ),
}


async def run_with_neighbour(tt: Tooltrail, call: ToolCall, dispatch: str) -> None:
    """Run ``call`` after a good call; both must come back, the good one unharmed."""
    results = await finish(
        tt, [ToolCall("first", "echo", {"text": "before"}), call], RunConfig(dispatch=dispatch)
    )
    assert [r.tool_call_id for r in results] == ["first", call.id]
    assert (results[0].is_error, results[0].output) == (False, "before")
    check_result(call, results[1])


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
@pytest.mark.parametrize("case", list(EDGE_CASES))
async def test_edge_case_finishes_with_a_clear_result(
    tt: Tooltrail, case: str, dispatch: str
) -> None:
    await run_with_neighbour(tt, EDGE_CASES[case], dispatch)


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
@pytest.mark.parametrize("case", list(FORMERLY_STUCK))
async def test_formerly_stuck_input_finishes_with_a_clear_result(
    tt: Tooltrail, case: str, dispatch: str
) -> None:
    await run_with_neighbour(tt, FORMERLY_STUCK[case][0], dispatch)


# -- duplicate tool_call_ids -------------------------------------------------------------------


def duplicate_text(call_id: str) -> str:
    return f"duplicate tool_call_id '{call_id}': only the first call with this id runs"


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
async def test_only_the_first_call_with_an_id_runs(tt: Tooltrail, dispatch: str) -> None:
    marker = f"first-{uuid.uuid4()}"
    before = runs.copy()
    results = await finish(
        tt,
        [
            ToolCall("dup", "echo", {"text": marker}),
            ToolCall("other", "double", {"n": 2}),
            ToolCall("dup", "echo", {"text": "second"}),
            ToolCall("dup", "double", {"n": 5}),
            ToolCall("other", "nope", "garbage"),
        ],
        RunConfig(dispatch=dispatch),
    )
    assert [(r.tool_call_id, r.is_error, r.output) for r in results] == [
        ("dup", False, marker),
        ("other", False, "4"),
        ("dup", True, duplicate_text("dup")),
        ("dup", True, duplicate_text("dup")),
        ("other", True, duplicate_text("other")),
    ]
    assert runs["echo"] - before["echo"] == 1
    assert runs["double"] - before["double"] == 1


async def test_a_duplicate_of_a_refused_call_does_not_run_either(tt: Tooltrail) -> None:
    before = runs.copy()
    results = await finish(
        tt,
        [ToolCall("x", "missing", {}), ToolCall("x", "echo", {"text": "should not run"})],
        RunConfig(),
    )
    assert [(r.tool_call_id, r.is_error, r.output) for r in results] == [
        ("x", True, "tool 'missing' is not available"),
        ("x", True, duplicate_text("x")),
    ]
    assert runs["echo"] == before["echo"]
