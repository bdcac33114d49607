"""Incremental Server-Sent Events parsing: bytes in, `data` payloads out, bounded in memory."""

from __future__ import annotations

__all__ = ["SseParser"]


class SseParser:
    """Feed raw stream bytes; get back the `data` payload of each complete event.

    Lines may end in LF or CRLF. Fields other than `data` are ignored. An event (or an unterminated line)
    larger than `max_event_bytes` is dropped and counted in `dropped`, so a hostile stream cannot make the
    parser hold more than about that many bytes.
    """

    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._skipping = False
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        events: list[str] = []
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            self._line(bytes(self._buf[start:end]).rstrip(b"\r"), events)
            start = end + 1
        del self._buf[:start]
        if len(self._buf) > self._max:
            self._buf.clear()
            self._overflow()
        return events

    def _line(self, line: bytes, events: list[str]) -> None:
        if not line:
            if self._data and not self._skipping:
                events.append(b"\n".join(self._data).decode("utf-8", "replace"))
            self._data, self._size, self._skipping = [], 0, False
            return
        if self._skipping or not line.startswith(b"data:"):
            return
        value = line[6:] if line.startswith(b"data: ") else line[5:]
        self._size += len(value)
        if self._size > self._max:
            self._overflow()
            return
        self._data.append(value)

    def _overflow(self) -> None:
        self.dropped += 1
        self._data, self._size, self._skipping = [], 0, True
