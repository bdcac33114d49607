"""The base of every wire model, and the small vocabularies several of them share."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coding_agent_env.settings import WireLimits
from coding_agent_env.settings.dialects import NativeDialect

__all__ = ["Mode", "NativeDialect", "WireModel", "name_field"]


class Mode(str, Enum):
    """How LLM calls are handled: `transparent_proxy` also asks the upstream for logprobs and token ids."""

    BLACK_BOX = "black_box"
    TRANSPARENT_PROXY = "transparent_proxy"


class WireModel(BaseModel):
    """A model on the wire: an unknown field is an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


def name_field(description: str) -> Any:
    """An optional name (a backend, an image, an endpoint, an id): null unless given, bounded."""
    return Field(default=None, max_length=WireLimits.MAX_NAME_CHARS, description=description)
