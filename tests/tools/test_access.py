"""Unit tests of the access gate (guardrails spec §6): configuration, ScopeGate, fail-closed.

Pure tests of ``authorize`` (step 2 of dispatch and the preflight) and ``AccessController``;
the dispatcher-level scenarios (audit rows, store calls) belong to the dispatcher's tests.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tooltrail.errors import TooltrailError
from tooltrail.tools.access import (
    AccessConfig,
    AccessConfigFrozenError,
    AccessController,
    AccessDecision,
    AccessGate,
    AccessRequest,
    AuthorityScope,
    Principal,
    ScopeGate,
    Subject,
    authorize,
)

P1 = Principal("p1")


class RecordingGate:
    """Remembers every request; allows everything."""

    def __init__(self) -> None:
        self.requests: list[AccessRequest] = []

    async def check(self, request: AccessRequest) -> AccessDecision:
        self.requests.append(request)
        return AccessDecision(True, "recorded")


class RaisingGate:
    async def check(self, request: AccessRequest) -> AccessDecision:
        raise RuntimeError("database of secrets unreachable")


class MutatingGate:
    """Tries to change the arguments it was shown."""

    async def check(self, request: AccessRequest) -> AccessDecision:
        args: Any = request.arguments
        attempts: list[Callable[[], object]] = [
            lambda: args.__setitem__("n", 2),
            lambda: args["nested"].__setitem__("k", 1),
            lambda: args["items"].append(1),
        ]
        for attempt in attempts:
            try:
                attempt()
            except (TypeError, AttributeError):
                continue
            return AccessDecision(False, "mutation succeeded")
        return AccessDecision(True, "read only")


# -- configuration -------------------------------------------------------------------------------


def test_identities():
    assert Principal("svc-billing").id == "svc-billing"
    assert Subject("agent-7").id == "agent-7"
    with pytest.raises(ValueError, match="principal"):
        Principal("")
    with pytest.raises(dataclasses.FrozenInstanceError):
        P1.id = "root"  # type: ignore[misc]


def test_access_config_defaults_and_allow_all():
    config = AccessConfig(P1, AuthorityScope(allowed_tools={"search_*"}))
    assert config.subject is None
    assert isinstance(config.gate, ScopeGate)
    assert config.authority.allowed_tools == frozenset({"search_*"})
    everything = AccessConfig.allow_all(P1)
    assert everything.principal == P1
    assert everything.authority == AuthorityScope.all()
    assert AuthorityScope.all().allowed_tools == frozenset({"*"})
    assert everything == AccessConfig.allow_all(Principal("p1"))


def test_access_config_accepts_ids_as_strings_and_no_principal():
    config = AccessConfig("svc", AuthorityScope.all(), subject="agent-7")
    assert config.principal == Principal("svc")
    assert config.subject == Subject("agent-7")
    assert AccessConfig(principal=None).principal is None
    # With no authority given, nothing is allowed.
    assert AccessConfig(P1).authority == AuthorityScope()


def test_access_config_rejects_wrong_types():
    with pytest.raises(TypeError):
        AccessConfig(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AccessConfig(P1, {"*"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AccessConfig(P1, AuthorityScope.all(), gate=object())  # type: ignore[arg-type]


def test_authority_scope_takes_sets_and_frozensets():
    scope = AuthorityScope(allowed_tools={"a"}, denied_tools=frozenset({"b"}))
    assert scope.allowed_tools == frozenset({"a"})
    assert scope.denied_tools == frozenset({"b"})
    hash(scope)
    # A lone string is one pattern.
    assert AuthorityScope(allowed_tools="search_*").allowed_tools == frozenset({"search_*"})  # type: ignore[arg-type]


def test_gates_satisfy_the_protocol():
    assert isinstance(ScopeGate(), AccessGate)
    assert isinstance(RecordingGate(), AccessGate)


def test_decision_error_text():
    decision = AccessDecision(False, "tool 't' is outside the authority of principal 'p1'")
    assert decision.error_text == (
        "access denied: tool 't' is outside the authority of principal 'p1'"
    )
    assert AccessDecision.deny("x") == AccessDecision(False, "x")
    assert AccessDecision.allow().allowed is True


# -- step 2 ----------------------------------------------------------------------------------------


async def test_no_access_configuration_means_no_gate():  # scenario 32, first half
    decision = await authorize(None, "t", "static", {"n": 1})
    assert decision.allowed is True


async def test_config_without_principal_fails_closed_without_asking_the_gate():  # scenario 32
    gate = RecordingGate()
    decision = await authorize(
        AccessConfig(None, AuthorityScope.all(), gate=gate), "t", "static", {}
    )
    assert decision == AccessDecision(False, "no principal configured")
    assert decision.error_text == "access denied: no principal configured"
    assert gate.requests == []


async def test_tool_outside_the_authority_is_denied():  # scenario 33
    config = AccessConfig(P1, AuthorityScope(allowed_tools={"other"}))
    decision = await authorize(config, "t", "static", {"n": "abc"})
    assert decision.allowed is False
    assert decision.error_text == (
        "access denied: tool 't' is outside the authority of principal 'p1'"
    )


async def test_denied_patterns_win_over_allowed_ones():  # scenario 33, second half
    config = AccessConfig(P1, AuthorityScope(allowed_tools={"*"}, denied_tools={"send_*"}))
    denied = await authorize(config, "send_email", "static", {})
    assert denied.error_text == "access denied: tool 'send_email' is denied for principal 'p1'"
    assert (await authorize(config, "search_web", "static", {})).allowed is True


async def test_empty_authority_allows_nothing():
    decision = await authorize(AccessConfig(P1, AuthorityScope()), "t", "dynamic", {})
    assert decision.reason == "tool 't' is outside the authority of principal 'p1'"


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("search_web", True),
        ("search_", True),
        ("send_email", True),
        ("Search_web", False),
        ("search", False),
        ("send_emails", False),
        ("research_web", False),
    ],
)
async def test_glob_matching_is_fnmatch_and_case_sensitive(name, allowed):
    config = AccessConfig(
        Principal("svc-billing"),
        AuthorityScope(allowed_tools={"search_*", "send_email"}),
        Subject("agent-7"),
    )
    assert (await authorize(config, name, "static", None)).allowed is allowed


async def test_an_argument_named_principal_never_changes_the_identity():  # scenario 34
    gate = RecordingGate()
    config = AccessConfig(P1, AuthorityScope.all(), gate=gate)
    await authorize(config, "admin_op", "static", {"principal": "root"})
    assert gate.requests[0].principal == P1
    assert gate.requests[0].arguments["principal"] == "root"

    scoped = AccessConfig(P1, AuthorityScope(allowed_tools={"read"}))
    decision = await authorize(scoped, "admin_op", "static", {"principal": "root"})
    assert decision.error_text == (
        "access denied: tool 'admin_op' is outside the authority of principal 'p1'"
    )


async def test_gate_receives_the_whole_request():
    gate = RecordingGate()
    authority = AuthorityScope(allowed_tools={"x"})
    config = AccessConfig(P1, authority, Subject("agent-7"), gate=gate)
    await authorize(config, "remote", "dynamic", {"a": [1, {"b": 2}]})
    request = gate.requests[0]
    assert request.principal == P1
    assert request.authority == authority
    assert request.subject == Subject("agent-7")
    assert request.tool_name == "remote"
    assert request.tool_kind == "dynamic"
    assert isinstance(request.arguments, Mapping)
    assert request.arguments["a"][1]["b"] == 2
    await authorize(config, "remote", "static", None)
    assert dict(gate.requests[1].arguments) == {}


async def test_gate_sees_a_deeply_read_only_copy_of_the_raw_arguments():
    arguments = {"n": 1, "nested": {"k": 0}, "items": [0]}
    config = AccessConfig(P1, AuthorityScope.all(), gate=MutatingGate())
    decision = await authorize(config, "t", "static", arguments)
    assert decision == AccessDecision(True, "read only")
    assert arguments == {"n": 1, "nested": {"k": 0}, "items": [0]}


async def test_a_raising_gate_denies_and_is_not_propagated(caplog):  # scenario 37
    config = AccessConfig(P1, AuthorityScope.all(), gate=RaisingGate())
    decision = await authorize(config, "t", "static", {})
    assert decision.allowed is False
    assert decision.error_text == "access denied: gate error (RuntimeError)"
    assert "secrets" not in decision.error_text
    assert "access gate" in caplog.text


async def test_a_gate_returning_garbage_denies():
    class Sloppy:
        async def check(self, request: AccessRequest) -> Any:
            return True

    decision = await authorize(AccessConfig(P1, gate=Sloppy()), "t", "static", {})
    assert decision.error_text == "access denied: gate error (TypeError)"


async def test_decisions_are_a_pure_function_of_configuration_and_call():  # scenario 35 (gate)
    authorities = [
        AuthorityScope(),
        AuthorityScope.all(),
        AuthorityScope(allowed_tools={"t*"}, denied_tools={"tx"}),
        AuthorityScope(allowed_tools={"other"}),
    ]
    principals: list[Principal | None] = [P1, None]
    names = ["t", "tx", "other"]
    arguments: list[dict[str, Any] | None] = [None, {}, {"principal": "root", "n": "abc"}]
    for authority, principal, name, args in itertools.product(
        authorities, principals, names, arguments
    ):
        config = AccessConfig(principal, authority)
        first = await authorize(config, name, "static", args)
        again = await authorize(config, name, "static", args)
        assert first == again
        if principal is None:
            assert first.reason == "no principal configured"
        elif authority.denies(name) or not authority.allows(name):
            assert first.allowed is False
            assert first.error_text.startswith(f"access denied: tool '{name}' is ")
        else:
            assert first.allowed is True


# -- the controller --------------------------------------------------------------------------------


async def test_controller_configures_any_subset_until_frozen():  # scenario 36 (controller)
    controller = AccessController(AccessConfig(P1, AuthorityScope(allowed_tools={"a"})))
    assert controller.principal == P1
    controller.configure(authority=AuthorityScope(allowed_tools={"b"}))
    assert controller.principal == P1
    assert (await controller.check("b", "static", {})).allowed is True
    assert (await controller.check("a", "static", {})).allowed is False
    controller.configure(principal=Principal("p2"), subject="agent-1")
    assert controller.config is not None
    assert controller.config.subject == Subject("agent-1")
    assert (await controller.check("a", "static", {})).reason == (
        "tool 'a' is outside the authority of principal 'p2'"
    )
    controller.freeze()
    assert controller.frozen is True
    with pytest.raises(AccessConfigFrozenError, match="frozen") as info:
        controller.configure(principal=Principal("root"))
    assert isinstance(info.value, TooltrailError)
    assert controller.principal == Principal("p2")


async def test_controller_without_configuration_has_no_gate():
    controller = AccessController()
    assert controller.config is None
    assert controller.principal is None
    assert (await controller.check("t", "static", {})).allowed is True
    # Configuring installs a gate, which fails closed until everything is set.
    controller.configure(authority=AuthorityScope.all())
    assert (await controller.check("t", "static", {})).reason == "no principal configured"
    controller.configure(principal="p1")
    assert (await controller.check("t", "static", {})).allowed is True
