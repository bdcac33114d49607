"""The `stream-json` event stream of Claude-Code-style CLIs (Qwen Code, Claude Code), summarised.

One JSON object per line: `system` (init), `assistant` (a model message: `text` and `tool_use` content blocks,
`stop_reason`, `usage`), `user` (tool results), `stream_event`, and a final `result` (`is_error`, `num_turns`,
`usage`). Total: any text gives a report (see `events.json_lines` for the bounds).
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.agents.event_stream import AgentReport, items, json_lines

__all__ = ["parse_stream_json"]


def parse_stream_json(text: str) -> AgentReport:
    report = AgentReport()
    turns: int | None = None
    assistant_steps = 0
    for event in json_lines(text, report):
        kind = event.get("type")
        if kind == "assistant":
            message = event.get("message")
            if not isinstance(message, dict):
                continue
            assistant_steps += 1
            for block in items(message.get("content")):
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text":
                    report.add_text(block.get("text"))
                elif block.get("type") == "tool_use":
                    report.add_tool(block.get("name"), block.get("input"))
        elif kind == "result":
            if event.get("is_error") or event.get("subtype") not in (None, "success"):
                report.add_error(event.get("result") or event.get("subtype") or "error")
            turns = _int(event.get("num_turns"))
            usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
            total = _int(usage.get("total_tokens"))
            if total is None:  # Claude Code reports the two parts only
                total = (_int(usage.get("input_tokens")) or 0) + (_int(usage.get("output_tokens")) or 0)
            report.tokens += total
    report.steps = turns if turns is not None else assistant_steps
    return report


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
