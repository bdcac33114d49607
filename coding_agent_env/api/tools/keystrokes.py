"""`keystrokes`: keys typed into the session's episode's live shell (Terminus-2's tool), and the output after
`duration` seconds.

Offered while the session's episode lives, beside `terminal`. Its arguments are validated by
`episode.parse_keystrokes`; the result is a `TerminalResult` (no exit code: typed keys have none), whose text is
the output (and a note when the shell was restarted). An episode whose backend runs one exec per command
refuses it, saying so.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.api.tools.base import Tool
from coding_agent_env.api.tools.reply import ToolReply
from coding_agent_env.episode import KeystrokesCall, parse_keystrokes
from coding_agent_env.episode.terminal import KEYSTROKES_DESCRIPTION, KEYSTROKES_SCHEMA, KEYSTROKES_TOOL
from coding_agent_env.session import Session

__all__ = ["Keystrokes"]


class Keystrokes(Tool[KeystrokesCall]):
    name = KEYSTROKES_TOOL
    description = KEYSTROKES_DESCRIPTION

    def schema(self) -> dict[str, Any]:
        return KEYSTROKES_SCHEMA

    def validate(self, arguments: Any) -> KeystrokesCall:
        return parse_keystrokes(arguments)

    def offered(self, live_episode: bool) -> bool:
        return live_episode

    async def run(self, session: Session, arguments: KeystrokesCall) -> ToolReply:
        result = await session.keystrokes(arguments)
        text = result.output if result.note is None else f"{result.output}\n[{result.note}]".lstrip("\n")
        return ToolReply.of(result, text=text)
