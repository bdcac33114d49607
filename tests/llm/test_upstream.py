"""Endpoint catalog resolution: explicit > environment > default, and server keys stay with their URL."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from coding_agent_env.errors import EndpointError, SettingsError, UnknownEndpointError
from coding_agent_env.llm import resolve_upstream
from coding_agent_env.models import Mode, RolloutRequest
from coding_agent_env.settings import Settings

ENV = {"OPENAI_API_KEY": "sk-openai-server", "HF_TOKEN": "hf-server", "VLLM_BASE_URL": "http://127.0.0.1:8011/v1",
       "VLLM_MODEL": "Qwen/Qwen3-4B"}


def request(**kw: object) -> RolloutRequest:
    return RolloutRequest(instruction="do it", **kw)  # type: ignore[arg-type]


def test_builtin_entries_use_env_then_defaults() -> None:
    settings = Settings.from_env(ENV)
    openai_up = resolve_upstream(request(endpoint="openai", model="gpt-x"), settings)
    assert (openai_up.base_url, openai_up.secret()) == ("https://api.openai.com/v1", "sk-openai-server")
    vllm = resolve_upstream(request(endpoint="vllm", mode="transparent_proxy", top_logprobs=2), settings)
    assert (vllm.base_url, vllm.model, vllm.token_ids, vllm.mode) == (ENV["VLLM_BASE_URL"], "Qwen/Qwen3-4B", True, Mode.TRANSPARENT_PROXY)
    hf = resolve_upstream(request(endpoint="hf_router", model="meta-llama/Llama-3.1-8B-Instruct"), settings)
    assert hf.secret() == "hf-server" and hf.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_explicit_model_and_key_win() -> None:
    up = resolve_upstream(request(endpoint="vllm", model="other/Model", api_key="caller-key"), Settings.from_env(ENV))
    assert (up.model, up.secret()) == ("other/Model", "caller-key")


def test_caller_base_url_uses_only_the_callers_key() -> None:
    up = resolve_upstream(request(base_url="http://127.0.0.1:9999/v1", api_key="caller", model="m"), Settings.from_env(ENV))
    assert up.secret() == "caller" and up.endpoint is None


def test_caller_base_url_without_key_is_refused_even_if_the_model_check_is_bypassed() -> None:
    hostile = RolloutRequest.model_construct(instruction="x", base_url="http://evil.example/v1", api_key=None,
                                             endpoint=None, model="m", mode=Mode.BLACK_BOX, max_tokens_cap=None,
                                             disable_thinking=False, top_logprobs=0)
    with pytest.raises(EndpointError, match="caller-supplied api_key"):
        resolve_upstream(hostile, Settings.from_env(ENV))


def test_operator_entries_and_default_endpoint() -> None:
    settings = Settings.from_env({**ENV, "LLM_ENDPOINTS": '{"lab": {"base_url": "http://10.0.0.5:8000/v1", '
                                  '"api_key": "lab-key", "default_model": "lab/M"}}', "LLM_DEFAULT_ENDPOINT": "lab"})
    up = resolve_upstream(request(), settings)
    assert (up.base_url, up.secret(), up.model, up.endpoint) == ("http://10.0.0.5:8000/v1", "lab-key", "lab/M", "lab")


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"endpoint": "nope"}, UnknownEndpointError),
        ({}, EndpointError),
        ({"endpoint": "openai"}, EndpointError),  # no server-held key
        ({"base_url": "ftp://x/v1", "api_key": "k", "model": "m"}, EndpointError),
        ({"base_url": "http://user:pw@x/v1", "api_key": "k", "model": "m"}, EndpointError),
        ({"base_url": "http://x/v1", "api_key": "k"}, EndpointError),  # no model
    ],
)
def test_refused_combinations(kw: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        resolve_upstream(request(**kw), Settings())
    assert "pw" not in str(caught.value)


def test_missing_server_key_is_refused() -> None:
    with pytest.raises(EndpointError, match="no server-held key"):
        resolve_upstream(request(endpoint="openai", model="gpt-x"), Settings())


def test_upstream_repr_hides_the_key() -> None:
    up = resolve_upstream(request(endpoint="openai", model="gpt-x", api_key=SecretStr("sk-visible?")), Settings())
    assert "sk-visible?" not in repr(up)


def test_upstream_catalog_variables_and_defaults() -> None:
    """OpenEnv's opencode_env / pi_env catalog names carry over, with their default models."""
    settings = Settings.from_env({"VLLM_URL": "http://127.0.0.1:8011", "VLLM_API_KEY": "intercepted",
                                  "OPENAI_API_KEY": "sk-o", "OPENAI_MODEL": "gpt-o", "HF_TOKEN": "hf-general",
                                  "HF_ROUTER_API_KEY": "hf-router"})
    vllm = resolve_upstream(request(endpoint="vllm"), settings)
    assert (vllm.base_url, vllm.model, vllm.secret()) == ("http://127.0.0.1:8011/v1", "Qwen/Qwen3.5-4B", "intercepted")
    assert resolve_upstream(request(endpoint="openai"), settings).model == "gpt-o"
    hf = resolve_upstream(request(endpoint="hf_router"), settings)
    assert (hf.model, hf.secret()) == ("Qwen/Qwen3-4B-Instruct-2507:nscale", "hf-router")
    plain = Settings.from_env({"OPENAI_API_KEY": "sk-o", "HF_TOKEN": "hf-general"})
    assert resolve_upstream(request(endpoint="openai"), plain).model == "gpt-4o-mini"
    assert resolve_upstream(request(endpoint="hf_router"), plain).secret() == "hf-general"


def test_vllm_url_and_base_url_must_agree() -> None:
    same = Settings.from_env({"VLLM_URL": "http://h:8000/", "VLLM_BASE_URL": "http://h:8000/v1"})
    assert same.vllm_endpoint_url == "http://h:8000/v1"
    with pytest.raises(SettingsError, match="vllm"):
        Settings.from_env({"VLLM_URL": "http://h:8000", "VLLM_BASE_URL": "http://other:8000/v1"})


@pytest.mark.parametrize(("endpoint", "asked", "off"), [
    ("vllm", None, True), ("vllm", False, False), ("openai", None, False), ("openai", True, True),
])
def test_disable_thinking_null_means_the_endpoints_default(endpoint: str, asked: bool | None, off: bool) -> None:
    settings = Settings.from_env(ENV)
    assert resolve_upstream(request(endpoint=endpoint, model="m", disable_thinking=asked), settings).disable_thinking is off


def test_endpoint_with_callers_url_and_key_takes_only_the_entrys_defaults() -> None:
    """Upstream clients may name an endpoint and override its URL: the caller's key goes there, never ours."""
    settings = Settings.from_env(ENV)
    up = resolve_upstream(request(endpoint="vllm", base_url="http://127.0.0.1:9999/v1", api_key="caller"), settings)
    assert (up.base_url, up.secret(), up.model, up.disable_thinking) == (
        "http://127.0.0.1:9999/v1", "caller", "Qwen/Qwen3-4B", True)
    with pytest.raises(ValueError, match="api_key"):
        request(endpoint="vllm", base_url="http://127.0.0.1:9999/v1")
