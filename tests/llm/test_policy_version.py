"""Each turn says which policy produced it: the request's `policy_version` (carried by the lease, movable while the
rollout runs), unless the engine reports its own for the call (its answer's `X-Policy-Version` header, or SGLang's
`metadata.weight_version`); the training trace carries it in each turn's metadata, which OpenEnv 0.10 accepts.

Calls go through the real relay to the fake engines. Header bytes no ASGI server would send (control characters)
are added by `HeaderFront`, a loopback TCP front that passes the fake's answer on with extra raw header lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic import ValidationError

from coding_agent_env.llm import Relay, resolve_upstream
from coding_agent_env.llm.lease import Lease
from coding_agent_env.llm.trace import annotate, trace_entries, training_data
from coding_agent_env.models import Mode, RolloutRequest
from coding_agent_env.models.turns import policy_version_or_none
from coding_agent_env.settings import Settings
from tests.compat.conftest import gen_b  # noqa: F401 (a fixture)
from tests.fakes.engines import SglangLLM
from tests.fakes.llm import FakeLLM, FakeLLMServer, Receive, Reply, Scope, Send
from tests.helpers import poll
from tests.llm.conftest import SERVER_KEY, upstream_for
from tests.llm.test_trace import BASH, SYSTEM, ask, echo

USER = {"role": "user", "content": "Write binary_search.py please"}


def _with_version(send: Send, version: str | None) -> Send:
    """`send` that adds `X-Policy-Version: version` to the answer's headers (none when `version` is None)."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and version is not None:
            message = {**message, "headers": [*message.get("headers", []), (b"x-policy-version", version.encode())]}
        await send(message)

    return sending


@dataclass
class VersionedLLM(FakeLLM):
    """The fake engine behind a router that names the policy of each answer: the next of `header_versions` per
    chat call (None, or the list used up: no header)."""

    header_versions: list[str | None] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = self.header_versions.pop(0) if self.header_versions and scope.get("type") == "http" else None
        await super().__call__(scope, receive, _with_version(send, version))


@dataclass
class VersionedSglang(SglangLLM):
    """SGLang's answer with its `metadata.weight_version` (as serving_chat writes it on whole answers), and
    optionally a router's header too."""

    weight_version: str = "default"
    header_versions: list[str | None] = field(default_factory=list)

    def shape_whole(self, whole: dict[str, Any], answer: Any) -> dict[str, Any]:
        whole = super().shape_whole(whole, answer)
        whole["metadata"] = {"weight_version": self.weight_version}
        return whole

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = self.header_versions.pop(0) if self.header_versions and scope.get("type") == "http" else None
        await super().__call__(scope, receive, _with_version(send, version))


class HeaderFront:
    """A loopback TCP front for an upstream: passes the bytes both ways, adding `header` (raw header lines, CRLF
    ended) and `Connection: close` after the status line of the upstream's answer, so one connection carries one
    call. For bytes an upstream can send but no ASGI server will (control characters in a header value)."""

    def __init__(self, port: int, header: bytes) -> None:
        self._port = port
        self._header = header
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aenter__(self) -> HeaderFront:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        try:
            upward = asyncio.ensure_future(pipe(reader, up_writer))
            status = await up_reader.readuntil(b"\r\n")
            writer.write(status + self._header + b"Connection: close\r\n")
            await asyncio.gather(upward, pipe(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()


async def _calls(lease: Lease, count: int, *, stream: bool = False) -> list[Any]:
    """`count` chat calls of one conversation, each continuing the last (so they are one line in the graph)."""
    history: list[dict[str, Any]] = [SYSTEM, USER]
    answers = []
    async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
        for _ in range(count):
            message = await ask(llm, history, stream=stream)
            answers.append(message)
            if not stream:
                history += [echo(message), {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"}]
    return answers


def test_the_request_field_is_a_bounded_name() -> None:
    base: dict[str, Any] = {"instruction": "go", "base_url": "http://127.0.0.1:9/v1", "api_key": "k", "model": "m"}
    assert RolloutRequest(**base, policy_version="step-7").policy_version == "step-7"
    assert RolloutRequest(**base, policy_version="").policy_version is None  # upstream's clients send "" for unset
    for bad in ("step 7", "step\x1b[31m", "step-7\n", "x" * 513, "é"):
        with pytest.raises(ValidationError, match="policy_version"):
            RolloutRequest(**base, policy_version=bad)
    assert RolloutRequest(**base, policy_version="x" * 512).policy_version == "x" * 512
    assert [policy_version_or_none(v) for v in ("v1", "a\tb", "a\x00", "v1\n", "x" * 513, 7, None, "")] == [
        "v1", None, None, None, None, None, None, None]


async def test_request_value_on_every_turn(relay: Relay, fake: FakeLLMServer, tmp_path: Path) -> None:
    request = RolloutRequest(instruction="go", base_url=fake.base_url, api_key=SERVER_KEY, model="m",
                             policy_version="step-7")
    upstream = resolve_upstream(request, Settings(state_dir=tmp_path / "s"))
    assert upstream.policy_version == "step-7"
    fake.app.reset([Reply(content="Looking", tool_calls=(BASH,))])
    lease = await relay.open_lease("r", upstream)
    try:
        await _calls(lease, 2)
        await _calls(lease, 1, stream=True)
        turns = lease.turns()
    finally:
        await lease.close()
    assert [(t.upstream_status, t.error, t.policy_version) for t in turns] == [(200, None, "step-7")] * 3
    none = await relay.open_lease("n", upstream_for(fake))
    try:
        await _calls(none, 1)
        assert [t.policy_version for t in none.turns()] == [None]
    finally:
        await none.close()


async def test_an_upstream_header_wins_for_its_turn(relay: Relay) -> None:
    app = VersionedLLM(api_key=SERVER_KEY, script=[Reply(content="Looking", tool_calls=(BASH,))],
                       header_versions=[None, "step-8", None])
    with FakeLLMServer(app) as server:
        lease = await relay.open_lease("r", upstream_for(server, policy_version="step-7"))
        try:
            await _calls(lease, 2)
            await _calls(lease, 1, stream=True)
            versions = [t.policy_version for t in lease.turns()]
        finally:
            await lease.close()
    assert versions == ["step-7", "step-8", "step-7"]


@pytest.mark.parametrize(("header", "expected"), [
    (b"X-Policy-Version: step-9\r\n", "step-9"),  # the front itself passes a good header on
    (b"X-Policy-Version: " + b"v" * 8000 + b"\r\n", "step-7"),
    (b"X-Policy-Version: step-9\x1b[31m\x01\x7f\r\n", "step-7"),
    (b"X-Policy-Version: step\t9 \xff\r\n", "step-7"),
    (b"X-Policy-Version: \r\n", "step-7"),
], ids=["valid", "huge", "control", "blank-and-8bit", "empty"])
async def test_a_hostile_header_is_refused_and_the_call_succeeds(relay: Relay, fake: FakeLLMServer, header: bytes,
                                                                 expected: str) -> None:
    fake.app.reset([Reply(content="fine")])
    async with HeaderFront(fake.port, header) as front:
        lease = await relay.open_lease("r", upstream_for(fake, base_url=front.base_url, policy_version="step-7"))
        try:
            async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
                answer = await llm.chat.completions.create(model="m", messages=[SYSTEM, USER])
            [turn] = lease.turns()
        finally:
            await lease.close()
    assert answer.choices[0].message.content == "fine"
    assert (turn.upstream_status, turn.error, turn.policy_version) == (200, None, expected)


async def test_an_update_on_a_live_lease_applies_to_later_turns_only(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.reset([Reply(content="Looking", tool_calls=(BASH,)), Reply(content="Looking", tool_calls=(BASH,)),
                    Reply(hang=True)])
    lease = await relay.open_lease("r", upstream_for(fake, policy_version="step-7"))
    try:
        await _calls(lease, 1)
        lease.set_policy_version("step-8")
        assert lease.policy_version == "step-8"
        with pytest.raises(ValueError, match="policy_version"):
            lease.set_policy_version("step 9")
        assert lease.policy_version == "step-8"
        await _calls(lease, 1)
        # A call in flight when the version moves keeps the one it started with.
        async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
            hanging = asyncio.ensure_future(llm.chat.completions.create(model="m", messages=[SYSTEM, USER]))
            await poll(lambda: len(fake.app.requests) == 3, "the third call to reach the engine")
            lease.set_policy_version(None)
            await lease.close()
            with contextlib.suppress(Exception):
                await hanging
        turns = lease.turns()
    finally:
        await lease.close()
    assert [(t.policy_version, t.error) for t in turns] == [
        ("step-7", None), ("step-8", None), ("step-8", "lease closed")]
    assert lease.policy_version is None


async def test_sglang_reports_its_weight_version_in_the_answer(relay: Relay) -> None:
    app = VersionedSglang(api_key=SERVER_KEY, script=[Reply(content="Looking", tool_calls=(BASH,))],
                          weight_version="default", header_versions=[None, None, "step-13"])
    with FakeLLMServer(app) as server:
        lease = await relay.open_lease("r", upstream_for(server, mode=Mode.TRANSPARENT_PROXY, engine="sglang",
                                                         policy_version="step-7"))
        try:
            await _calls(lease, 1)  # "default": SGLang's label when no update named one, so the rollout's stands
            app.weight_version = "step-12"
            await _calls(lease, 1, stream=True)  # sent not streamed (SGLang's ids): its whole answer says
            await _calls(lease, 1)  # the header wins over the body
            turns = lease.turns()
        finally:
            await lease.close()
    assert [(t.engine, t.policy_version) for t in turns] == [("sglang", "step-7"), ("sglang", "step-12"),
                                                             ("sglang", "step-13")]


VALIDATE = """
import json, sys
from openenv.core.harness.training import TrainingTrace
trace = TrainingTrace.model_validate(json.load(sys.stdin))
print(json.dumps([[t.node_id, t.metadata.get("policy_version")] for t in trace.turns]))
"""


def openenv_versions(python: Path, trace: dict[str, Any]) -> list[list[Any]]:
    """Each turn's node id and metadata `policy_version` as OpenEnv 0.10's `TrainingTrace` reads them back."""
    done = subprocess.run([str(python), "-c", VALIDATE], input=json.dumps(trace), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


async def test_the_trace_carries_it_and_openenv_validates(relay: Relay, gen_b: Path) -> None:  # noqa: F811
    app = VersionedLLM(api_key=SERVER_KEY, script=[Reply(content="Looking", tool_calls=(BASH,))],
                       header_versions=[None, None, "step-9"])
    with FakeLLMServer(app) as server:
        lease = await relay.open_lease("r", upstream_for(server, mode=Mode.TRANSPARENT_PROXY, top_logprobs=1,
                                                         token_ids=True, policy_version="step-7"))
        try:
            history: list[dict[str, Any]] = [SYSTEM, USER]
            async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
                for step in range(3):
                    if step == 1:
                        lease.set_policy_version("step-8")
                    message = await ask(llm, history)
                    history += [echo(message), {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                                                "content": "ok"}]
            turns, graph = annotate(lease.turns(), "r")
        finally:
            await lease.close()
    assert [(t.parent, t.trainable, t.policy_version) for t in turns] == [
        (None, True, "step-7"), (0, True, "step-8"), (1, True, "step-9")]
    data = training_data(graph, rollout_id="r", task_id="t", reward=1.0)
    assert [t["metadata"]["policy_version"] for t in data.trace["turns"]] == ["step-7", "step-8", "step-9"]
    assert openenv_versions(gen_b, data.trace) == [["r:0", "step-7"], ["r:1", "step-8"], ["r:2", "step-9"]]
    entries = trace_entries(turns, data, 1.0)
    assert [e["metadata"]["policy_version"] for e in entries] == ["step-7", "step-8", "step-9"]
    untraced = trace_entries(turns, None, None)
    assert [e["metadata"]["policy_version"] for e in untraced] == ["step-7", "step-8", "step-9"]

