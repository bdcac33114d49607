"""Incremental Server-Sent Events parsing: bytes in, `data` payloads out, bounded in memory; and a whole chat
completion cut into the chunks a stream of it would have carried (`chunks_of`)."""

from __future__ import annotations

from typing import Any

__all__ = ["SseParser", "chunks_of"]


def chunks_of(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """The `chat.completion.chunk`s of a whole `chat.completion`, per choice: the role, reasoning, content and
    tool calls (each whole, with its index), then the finish reason with the choice's logprobs; then the usage
    (`choices` empty), as OpenAI streams with `include_usage`. What the relay streams to an agent whose call went
    upstream not streamed."""
    head: dict[str, Any] = {"id": completion.get("id") or "chatcmpl-relay", "object": "chat.completion.chunk",
                            "created": completion.get("created") or 0, "model": completion.get("model")}
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]
    out: list[dict[str, Any]] = []

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> None:
        out.append({**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None,
                                         **extra}]})

    choices = completion.get("choices")
    for position, choice in enumerate(choices if isinstance(choices, list) else []):
        if not isinstance(choice, dict):
            continue
        index = choice.get("index") if isinstance(choice.get("index"), int) else position
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        chunk(index, {"role": "assistant", "content": ""})
        for name in ("reasoning_content", "reasoning"):
            if isinstance(message.get(name), str) and message[name]:
                chunk(index, {name: message[name]})
        if isinstance(message.get("content"), str) and message["content"]:
            chunk(index, {"content": message["content"]})
        calls = message.get("tool_calls")
        for i, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict):
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                chunk(index, {"tool_calls": [{"index": i, "id": call.get("id"), "type": "function", "function": {
                    "name": function.get("name"), "arguments": function.get("arguments") or ""}}]})
        chunk(index, {}, finish_reason=choice.get("finish_reason") or "stop", logprobs=choice.get("logprobs"))
    if isinstance(completion.get("usage"), dict):
        out.append({**head, "choices": [], "usage": completion["usage"]})
    return out


class SseParser:
    """Feed raw stream bytes; get back the `data` payload of each complete event.

    Lines may end in LF or CRLF. Fields other than `data` are ignored. An event (or an unterminated tail)
    larger than `max_event_bytes` is dropped and counted in `dropped`, so a hostile stream cannot make the
    parser hold more than about that many bytes.
    """

    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._buf = b""
        self._skipping = False
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")  # a lone CR at the end waits for its LF in the next chunk
        *blocks, self._buf = buf.split(b"\n\n")
        events: list[str] = []
        for block in blocks:
            if self._skipping:
                self._skipping = False
                continue
            if len(block) > self._max:
                self.dropped += 1
                continue
            data = _data(block)
            if data is not None:
                events.append(data)
        if len(self._buf) > self._max:
            self._buf = b""
            self._skipping = True
            self.dropped += 1
        return events


def _data(block: bytes) -> str | None:
    """The joined `data` lines of one event block, or None when it has none."""
    if b"\n" not in block:
        lines = [block]
    else:
        lines = block.split(b"\n")
    values = [line[6:] if line.startswith(b"data: ") else line[5:] for line in lines if line.startswith(b"data:")]
    if not values:
        return None
    return (values[0] if len(values) == 1 else b"\n".join(values)).decode("utf-8", "replace")
