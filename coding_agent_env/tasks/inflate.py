"""Decompressing an untrusted byte string a little at a time, under running caps.

`BoundedInflate` is a read-only file object over gzip bytes (or uncompressed bytes, passed through) that
decompresses only what its reader asks for, at most `STEP` bytes of output per step, and raises `InflateLimitError`
the moment the output passes `max_bytes` or, past `ratio_grace` bytes of output, its ratio to the input consumed
passes `max_ratio`. A gzip bomb therefore costs at most one step beyond a cap, whatever its declared size: the
work done is bounded by the caps, not by the archive (`decompressed` reports it).
"""

from __future__ import annotations

import zlib

__all__ = ["GZIP_MAGIC", "STEP", "BoundedInflate", "InflateError", "InflateLimitError"]

GZIP_MAGIC = b"\x1f\x8b"
STEP = 64 << 10
"""At most this many bytes are decompressed (and fed) per step: the overshoot past a cap."""
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class InflateError(ValueError):
    """The bytes are not a readable gzip stream."""


class InflateLimitError(InflateError):
    """A cap was crossed; `decompressed` is how many bytes had been produced when it was refused."""

    def __init__(self, reason: str, decompressed: int) -> None:
        super().__init__(f"{reason} (refused after decompressing {decompressed} bytes)")
        self.reason = reason
        self.decompressed = decompressed


class BoundedInflate:
    """`read(size)` over the decompressed form of `data`; see the module docstring for the caps."""

    def __init__(self, data: bytes, *, max_bytes: int, max_ratio: float, ratio_grace: int) -> None:
        self._data = memoryview(data)
        self._max_bytes, self._max_ratio, self._ratio_grace = max_bytes, max_ratio, ratio_grace
        self._gzip = bytes(self._data[:2]) == GZIP_MAGIC
        self._inflater = zlib.decompressobj(_GZIP_WBITS) if self._gzip else None
        self._ended = False
        self._fed = 0
        """Input bytes handed to the inflater (or passed through)."""
        self._buffer = bytearray()
        self.decompressed = 0
        """Output bytes produced so far (decompressed, or passed through)."""

    @property
    def compressed(self) -> bool:
        return self._gzip

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that is left when negative: still step by step, so still capped)."""
        while size < 0 or len(self._buffer) < size:
            chunk = self._step()
            if not chunk:
                break
            self._buffer += chunk
        cut = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        out = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        return out

    def close(self) -> None:
        self._buffer.clear()

    def _step(self) -> bytes:
        """The next at most `STEP` bytes of output (b"" at the end), checked against the caps."""
        if self._inflater is None:
            chunk = bytes(self._data[self._fed:self._fed + STEP])
            self._fed += len(chunk)
        else:
            chunk = self._inflate()
        self.decompressed += len(chunk)
        self._check()
        return chunk

    def _inflate(self) -> bytes:
        assert self._inflater is not None
        while not self._ended:
            if self._inflater.eof:
                # First: at a member's end the input left over is `unused_data` (zlib may also still show it
                # as `unconsumed_tail`, which an ended inflater would never consume).
                self._ended = not self._next_member()
                continue
            tail = self._inflater.unconsumed_tail
            if not tail:
                if self._fed >= len(self._data):
                    return b""  # truncated: the tar reader reports the archive as cut short
                tail = bytes(self._data[self._fed:self._fed + STEP])
                self._fed += len(tail)
            try:
                chunk = self._inflater.decompress(tail, STEP)
            except zlib.error as exc:
                raise InflateError(f"not a readable gzip stream: {exc}") from None
            if chunk:
                return chunk
        return b""

    def _next_member(self) -> bool:
        """Go on into a following gzip member (concatenated gzip), if one follows; False at the end."""
        assert self._inflater is not None
        rest = self._inflater.unused_data
        self._fed -= len(rest)  # not consumed: read again from the data as the next member's start
        if bytes(self._data[self._fed:self._fed + 2]) != GZIP_MAGIC:
            return False  # trailing padding or nothing: the end
        self._inflater = zlib.decompressobj(_GZIP_WBITS)
        return True

    def _check(self) -> None:
        if self.decompressed > self._max_bytes:
            raise InflateLimitError(f"unpacks to more than {self._max_bytes} bytes", self.decompressed)
        consumed = self._fed - (len(self._inflater.unconsumed_tail) if self._inflater is not None else 0)
        if self.decompressed > self._ratio_grace and self.decompressed > self._max_ratio * max(consumed, 1):
            raise InflateLimitError(f"compresses more than {self._max_ratio:g}:1 (a decompression bomb?)",
                                    self.decompressed)
