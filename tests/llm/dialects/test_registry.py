"""The dialect registry (`llm.dialects`): every dialect the relay speaks is one `Dialect` listed there, and what
the rest of the server knows of dialects (the wire's names, the headers agents send) is read from it."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import SecretStr

from coding_agent_env.llm.dialects import DIALECTS, agent_headers, key_headers, route_of
from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.models import NativeDialect

PATHS = {
    "anthropic": ["/v1/messages", "/messages"],
    "responses": ["/v1/responses", "/responses"],
    "google": ["/v1beta/models/gemini-x:generateContent", "/v1/models/a/b:streamGenerateContent"],
}


def test_the_wire_names_the_registered_dialects() -> None:
    """`NativeDialect` is spelled out in the wire models (their schema lists it); a dialect added to the registry
    must be named there too, and only registered dialects may be."""
    assert sorted(get_args(NativeDialect)) == sorted(DIALECTS) == sorted(PATHS)
    assert all(name == dialect.name for name, dialect in DIALECTS.items())


@pytest.mark.parametrize("name", sorted(PATHS))
def test_each_dialect_claims_its_own_paths_and_no_other(name: str) -> None:
    for path in PATHS[name]:
        found = route_of(path)
        assert found is not None and found.dialect is DIALECTS[name], path
    for path in ("/v1/chat/completions", "/chat/completions", "/v1/models", "/v1/messages/x", "/v1beta/models/m"):
        assert route_of(path) is None, path


def test_a_google_path_says_the_model_and_whether_it_streams() -> None:
    whole, streamed = route_of(PATHS["google"][0]), route_of(PATHS["google"][1])
    assert whole is not None and (whole.model, whole.streamed) == ("gemini-x", False)
    assert streamed is not None and (streamed.model, streamed.streamed) == ("a/b", True)


def test_the_headers_agents_send_are_the_dialects_own() -> None:
    assert key_headers() == ("x-api-key", "x-goog-api-key")
    assert agent_headers() == {"x-api-key", "x-goog-api-key", "anthropic-version", "anthropic-beta"}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_pass_through_puts_the_key_the_model_and_the_cap_where_the_dialect_reads_them(name: str) -> None:
    dialect = DIALECTS[name]
    route = route_of(PATHS[name][0])
    assert route is not None
    upstream = Upstream(base_url="https://llm.example/v1/", api_key=SecretStr("sk-up"), model="up-model",
                        max_tokens_cap=64)
    body = {"model": "agent-model", "generationConfig": {"maxOutputTokens": 10, "temperature": 0},
            "max_tokens": 1000, "max_output_tokens": 1000, "stream": True}
    agent = {"anthropic-beta": "b1", "x-api-key": "car-relay-token", "authorization": "Bearer car-relay-token"}
    native = dialect.native(route, {"alt": "sse"}, body, upstream, agent)
    assert "car-relay-token" not in str(native.headers)
    secret = native.headers.get(dialect.key_header or "Authorization")
    assert secret == ("sk-up" if dialect.key_header else "Bearer sk-up")
    expected = {
        "anthropic": ("https://llm.example/v1/messages", "max_tokens", 64, True),
        "responses": ("https://llm.example/v1/responses", "max_output_tokens", 64, True),
        "google": ("https://llm.example/v1/models/up-model:generateContent?alt=sse", "generationConfig", None, False),
    }[name]
    url, field, capped, stream = expected
    assert (native.url, native.stream) == (url, stream)
    if name == "google":
        assert native.body["generationConfig"] == {"maxOutputTokens": 10, "temperature": 0}
        assert native.body["model"] == "agent-model"  # the model travels in the URL
    else:
        assert native.body[field] == capped and native.body["model"] == "up-model"
    assert body["generationConfig"] == {"maxOutputTokens": 10, "temperature": 0}  # the agent's body is not changed
    assert (native.headers.get("anthropic-beta"), native.headers.get("anthropic-version")) == (
        ("b1", "2023-06-01") if name == "anthropic" else (None, None))
