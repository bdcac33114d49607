"""A tool's answer, serialised once.

A result leaves the server as JSON text inside a frame (WS, JSON-RPC, HTTP `/step`) or as MCP structured content.
`Serialised` holds a result's JSON text, made once by pydantic; `protocols.shapes.dumps` writes that text into the
frame as is (never encoding the result again), and reading it as a mapping parses the text once, on first read
(MCP's structured content, in-process callers). `ToolReply` is what every tool returns to every door.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["Serialised", "ToolReply"]


class Serialised(Mapping[str, Any]):
    """A JSON object and its wire text, read-only. `text` is what goes out; the mapping is that text parsed."""

    __slots__ = ("_value", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._value: dict[str, Any] | None = None

    @classmethod
    def of(cls, model: BaseModel) -> Serialised:
        """The model's JSON (pydantic's one serialisation: the same text `model_dump_json` gives)."""
        return cls(model.model_dump_json())

    @property
    def value(self) -> dict[str, Any]:
        """The parsed object (parsed once; callers must not mutate it: `text` would no longer say the same)."""
        if self._value is None:
            self._value = json.loads(self.text)
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self.value[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.value)

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"Serialised({self.text[:80]!r}{'...' if len(self.text) > 80 else ''})"


@dataclass(frozen=True)
class ToolReply:
    """What a tool answered: `data` (the result: `Serialised`, or a small dict built for the reply), `text` (how
    it reads as text: `content[0].text` on every door), and for a step the observation's `reward` and `done`."""

    text: str
    data: Mapping[str, Any]
    reward: float | None = None
    done: bool = False

    @classmethod
    def of(cls, model: BaseModel, *, text: str | None = None, reward: float | None = None,
           done: bool = False) -> ToolReply:
        """`model` serialised once; its JSON text is also `text` unless the tool says it in words."""
        data = Serialised.of(model)
        return cls(data.text if text is None else text, data, reward, done)
