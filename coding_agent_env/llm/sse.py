"""Incremental Server-Sent Events parsing: bytes in, `data` payloads out, bounded in memory."""

from __future__ import annotations

__all__ = ["SseParser"]


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
