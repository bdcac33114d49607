"""Fakes of real inference engines' wire shapes, built on the scripted `FakeLLM` (same script, same tokenizer):

- `VllmLLM`: vLLM's OpenAI server as documented (`return_token_ids`: top-level `prompt_token_ids`, per-choice
  `token_ids`; `stop_reason` on every choice, vLLM's own field). `FakeLLM` itself already speaks the id fields.
- `SglangLLM`: SGLang's (>= 0.5.13) OpenAI server as its source has it: `return_prompt_token_ids` /
  `return_meta_info` refused on streamed calls (400, SGLang's flat error object), else the prompt ids in
  `choices[0].prompt_token_ids` and the sampled ids in `choices[0].meta_info.output_token_logprobs`
  (`[logprob, token_id, text]`); `matched_stop` on every choice; vLLM's `return_token_ids` ignored.
- `LlamaCppLLM`: llama.cpp's `llama-server` as seen on these machines: logprobs refused with tools + stream (400),
  each sampled token's id in `logprobs.content[].id`, no prompt ids, `timings` in every answer (the last chunk
  of a stream), `system_fingerprint` `b<build>-<hash>`, and `/apply-template` + `/tokenize` (the fake's template
  renders its pieces as a JSON list, which its tokenizer reads back) for prompt ids.
- `StrictOpenAI`: a hosted API that refuses any request field it does not know (`return_token_ids`).

None of them is the engine itself: vLLM and SGLang need a GPU; llama.cpp is also tested for real
(tests/llm/test_llamacpp.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tests.fakes.llm import FakeLLM, Receive, Reply, Scope, Send, _Answer, _json, _render

__all__ = ["LlamaCppLLM", "SglangLLM", "StrictOpenAI", "VllmLLM"]


async def _read(receive: Receive) -> dict[str, Any]:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            break
    return json.loads(raw) if raw else {}


class _Reshaped(_Answer):
    """An answer whose whole form and chunks an engine reshapes (`shape_whole`, `shape_chunk`)."""

    def __init__(self, reply: Reply, body: dict[str, Any], app: FakeLLM, engine: _EngineFake,
                 original: dict[str, Any]) -> None:
        super().__init__(reply, body, app)
        self.engine = engine
        self.original = original
        """The request as sent (`body` is as the base fake reads it)."""

    def _logprob(self, i: int) -> dict[str, Any]:
        entry = super()._logprob(i)
        return self.engine.shape_logprob(entry, self._token_id(i))

    def whole(self) -> dict[str, Any]:
        return self.engine.shape_whole(super().whole(), self)

    def chunks(self) -> list[dict[str, Any]]:
        out = super().chunks()
        return [self.engine.shape_chunk(chunk, self, last=i == len(out) - 1) for i, chunk in enumerate(out)]


@dataclass
class _EngineFake(FakeLLM):
    whole_delay_s: float = 0.0
    """Pause before a whole answer (a model working): for keep-alive tests."""

    def refuse(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def shape_logprob(self, entry: dict[str, Any], token_id: int) -> dict[str, Any]:
        return entry

    def shape_whole(self, whole: dict[str, Any], answer: _Reshaped) -> dict[str, Any]:
        return whole

    def shape_chunk(self, chunk: dict[str, Any], answer: _Reshaped, *, last: bool) -> dict[str, Any]:
        return chunk

    def sent_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as the base fake reads it (which id switches it honours)."""
        return body

    async def _answer(self, reply: Reply, body: dict[str, Any], send: Send) -> None:
        if reply.hang:
            await asyncio.Event().wait()
        if self.whole_delay_s and body.get("stream") is not True:
            await asyncio.sleep(self.whole_delay_s)
        if reply.status == 200 and (refusal := self.refuse(body)) is not None:
            self._served -= 1  # refused before the model ran: the reply is still the next one
            await _json(send, 400, refusal)
            return
        if reply.status != 200:
            await super()._answer(reply, body, send)
            return
        answer = _Reshaped(reply, self.sent_body(body), self, self, body)
        if body.get("stream") is True:
            await answer.stream(send)
        else:
            await _json(send, 200, answer.whole())


@dataclass
class VllmLLM(_EngineFake):
    def shape_whole(self, whole: dict[str, Any], answer: _Reshaped) -> dict[str, Any]:
        for choice in whole["choices"]:
            choice["stop_reason"] = None
        return whole

    def shape_chunk(self, chunk: dict[str, Any], answer: _Reshaped, *, last: bool) -> dict[str, Any]:
        for choice in chunk["choices"]:
            choice["stop_reason"] = None
        return chunk


@dataclass
class SglangLLM(_EngineFake):
    def refuse(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if body.get("stream") is True:
            for name in ("return_prompt_token_ids", "return_meta_info"):
                if body.get(name) is True:
                    return {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                            "message": f"{name} is not supported with streaming. Please set stream=false when "
                                       f"using {name}=true."}
        return None

    def sent_body(self, body: dict[str, Any]) -> dict[str, Any]:
        # The base fake adds vLLM's id fields on `return_token_ids`: ask it for them, then move them.
        return {**body, "return_token_ids": True, "logprobs": True}

    def shape_whole(self, whole: dict[str, Any], answer: _Reshaped) -> dict[str, Any]:
        prompt = whole.pop("prompt_token_ids", None)
        choice = whole["choices"][0]
        ids = choice.pop("token_ids", [])
        logprobs = choice.get("logprobs") or {"content": []}
        choice["matched_stop"] = None
        if answer.original.get("return_prompt_token_ids") is True:
            choice["prompt_token_ids"] = prompt
        if answer.original.get("return_meta_info") is True:
            choice["meta_info"] = {
                "prompt_tokens": len(prompt or []), "completion_tokens": len(ids),
                "output_token_logprobs": [[e["logprob"], i, e["token"]] for e, i in zip(logprobs["content"], ids)],
            }
        if answer.original.get("logprobs") is not True:
            choice["logprobs"] = None
        return whole

    def shape_chunk(self, chunk: dict[str, Any], answer: _Reshaped, *, last: bool) -> dict[str, Any]:
        chunk.pop("prompt_token_ids", None)
        for choice in chunk["choices"]:
            choice.pop("token_ids", None)
            choice["matched_stop"] = None
        return chunk


@dataclass
class LlamaCppLLM(_EngineFake):
    build: str = "b6000-0123abc"

    def refuse(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if body.get("stream") is True and body.get("logprobs") is True and body.get("tools"):
            return {"error": {"code": 400, "message": "logprobs is not supported with tools + stream",
                              "type": "invalid_request_error"}}
        return None

    def sent_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "return_token_ids"}  # not llama.cpp's: ignored

    def shape_logprob(self, entry: dict[str, Any], token_id: int) -> dict[str, Any]:
        return {"id": token_id, **entry}

    def _timings(self, answer: _Reshaped) -> dict[str, Any]:
        return {"prompt_n": len(answer.prompt_ids), "predicted_n": len(answer.sampled), "predicted_ms": 1.0}

    def shape_whole(self, whole: dict[str, Any], answer: _Reshaped) -> dict[str, Any]:
        whole["system_fingerprint"] = self.build
        whole["timings"] = self._timings(answer)
        return whole

    def shape_chunk(self, chunk: dict[str, Any], answer: _Reshaped, *, last: bool) -> dict[str, Any]:
        chunk["system_fingerprint"] = self.build
        if last:
            chunk["timings"] = self._timings(answer)
        return chunk

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in ("/apply-template", "/tokenize"):
            body = await _read(receive)
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            from tests.fakes.llm import SeenRequest

            self.requests.append(SeenRequest(scope["path"], scope["method"], headers, body))
            if scope["path"] == "/apply-template":
                await _json(send, 200, {"prompt": json.dumps(_render(body.get("messages")))})
            else:
                pieces = json.loads(body.get("content") or "[]")
                await _json(send, 200, {"tokens": [self.token_id(p) for p in pieces]})
            return
        await super().__call__(scope, receive, send)


@dataclass
class StrictOpenAI(_EngineFake):
    def refuse(self, body: dict[str, Any]) -> dict[str, Any] | None:
        for name in ("return_token_ids", "return_prompt_token_ids", "return_meta_info"):
            if name in body:
                return {"error": {"message": f"Unrecognized request argument supplied: {name}",
                                  "type": "invalid_request_error", "param": None, "code": None}}
        return None

    def sent_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "return_token_ids"}
