"""A rollout whose LLM calls failed says so in its `error` (`llm.failures`), whatever the agent's exit code."""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm import engines
from coding_agent_env.llm.failures import llm_failure
from coding_agent_env.models import Mode, RolloutRequest, Turn
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply


def turn(i: int, status: int | None = 200, error: str | None = None, detail: dict[str, Any] | None = None) -> Turn:
    return Turn(turn=i, upstream_status=status, error=error, upstream_error=detail)


def test_no_failure_and_recovered_transient_failures_say_nothing() -> None:
    assert llm_failure([turn(0), turn(1)], Mode.BLACK_BOX) is None
    assert llm_failure([turn(0, 503, "upstream returned 503: busy"), turn(1)], Mode.BLACK_BOX) is None
    assert llm_failure([turn(0), turn(1, None, "lease closed")], Mode.BLACK_BOX) is None
    assert llm_failure([], Mode.TRANSPARENT_PROXY) is None


def test_the_failure_the_agent_did_not_get_past_is_named_with_status_and_message() -> None:
    failure = llm_failure([turn(0), turn(1, 500, "upstream returned 500: x", {"message": "engine crashed"})],
                          Mode.BLACK_BOX)
    assert failure is not None and failure.type == "LlmUpstreamError" and failure.stage == "llm"
    assert failure.message == "upstream 500: engine crashed (call 2 of 2; 1 failed)"
    timeout = llm_failure([turn(0, None, "upstream timed out")], Mode.BLACK_BOX)
    assert timeout is not None and timeout.type == "LlmUpstreamError" and "upstream timed out" in timeout.message
    too_long = llm_failure([turn(0, 400, "e", {"message": "the prompt is too long"})], Mode.TRANSPARENT_PROXY)
    assert too_long is not None and too_long.type == "LlmRequestRefused"
    key = llm_failure([turn(0, 401, "e", {"message": "bad key"})], Mode.BLACK_BOX)
    assert key is not None and key.type == "LlmUpstreamError"


def test_a_refusal_of_what_the_relay_added_is_always_named_as_ours() -> None:
    refused = turn(0, 400, "e", {"message": "logprobs is not supported with tools + stream", "code": 400})
    failure = llm_failure([refused, turn(1)], Mode.TRANSPARENT_PROXY)
    assert failure is not None and failure.type == "LlmRewriteRefused"
    assert "upstream 400: logprobs is not supported with tools + stream" in failure.message
    # In black_box the relay added nothing: the same words are the agent's own request's.
    black = llm_failure([refused], Mode.BLACK_BOX)
    assert black is not None and black.type == "LlmRequestRefused"


async def test_a_rollout_whose_llm_refused_says_so_in_error(settings: Settings) -> None:
    engines.forget()
    with FakeLLMServer(FakeLLM(api_key="sk-f")) as fake:
        fake.app.script = [Reply(status=503, error_message="model is overloaded")]
        request = RolloutRequest(instruction="do it", agent="terminus", base_url=fake.base_url, api_key="sk-f",
                                 model="fake/m", verify=["true"], agent_timeout_s=30)
        result = await run_rollout(request, settings=settings)
    assert result.error_detail is not None and result.error_detail.type == "LlmUpstreamError"
    assert result.error is not None and "503" in result.error and "model is overloaded" in result.error, result.error


async def test_a_rollout_whose_llm_is_dead_says_so_in_error(settings: Settings) -> None:
    from tests.helpers import free_port

    request = RolloutRequest(instruction="do it", agent="terminus", base_url=f"http://127.0.0.1:{free_port()}/v1",
                             api_key="sk-f", model="fake/m", verify=["true"], agent_timeout_s=30)
    result = await run_rollout(request, settings=settings)
    assert result.error_detail is not None and result.error_detail.type == "LlmUpstreamError", result.error
    assert "upstream unreachable" in (result.error or "")
