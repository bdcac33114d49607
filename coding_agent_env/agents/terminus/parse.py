"""Turning model output into one `terminal` tool call: total, bounded, and never prose by accident.

Standard library only: this module is also part of the standalone program (see `terminus.loop`).

`arguments_to_call(arguments)` reads a native tool call's arguments (an object, or a JSON string of one,
JSON-in-a-string nested at most `MAX_STRING_NESTING` times). `build_terminal_tool_call(text)` handles
models without native tool calls, trying in order: `<tool_call>...</tool_call>` tags, fenced code blocks
holding a JSON call, a `terminal(command=...)` / `terminal(final_answer=...)` call, and bare JSON objects
(`{"name": "terminal", "arguments": {...}}`, `{"function": {...}}`, `{"command": ...}`,
`{"final_answer": ...}`). Text with none of these is a `ParseFailure`; only with `loose=True` do fenced shell
blocks, then the whole text, become a command.

Both functions return a `TerminalCall` or a `ParseFailure` and never raise: text beyond `MAX_TEXT_CHARS`,
bracket nesting beyond `MAX_DEPTH`, or too many candidates are parse failures, so the work per call is
linear in the (bounded) text.
"""

from __future__ import annotations

import json
import re
from collections import namedtuple

__all__ = [
    "MAX_DEPTH",
    "MAX_TEXT_CHARS",
    "TOOL_NAME",
    "ParseFailure",
    "TerminalCall",
    "arguments_to_call",
    "build_terminal_tool_call",
]

TOOL_NAME = "terminal"
MAX_TEXT_CHARS = 256 * 1024
"""Longest model output parsed."""
MAX_DEPTH = 32
"""Deepest bracket nesting accepted anywhere in the text."""
MAX_STRING_NESTING = 3
"""How many times `arguments` may be a JSON string wrapping more JSON."""
MAX_CANDIDATES = 64
"""Most tags, fences or `{` positions tried per text."""
_SHELL_FENCES = {"bash", "sh", "shell", "console", "zsh"}
_SPECIAL = re.compile(r'[\[\]{}()"\\]')
"""The characters `_depth_ok` looks at."""
_CALL = re.compile(r"\bterminal\s*\(\s*(command|final_answer)\s*=\s*")


# Named tuples, not dataclasses: `dataclasses` (and the `inspect` it pulls in) would be most of this module's
# import time, paid on every start of the standalone program.
class TerminalCall(namedtuple("TerminalCall", ("command", "final_answer"), defaults=(None, None))):
    """Exactly one of `command: str` (run it) and `final_answer: str` (the agent is done) is set."""

    __slots__ = ()


class ParseFailure(namedtuple("ParseFailure", ("reason",))):
    """Why no call was found (`reason: str`, for the model and the events)."""

    __slots__ = ()


def _depth_ok(text: str) -> bool:
    """Whether brackets (outside strings, parentheses included) nest at most MAX_DEPTH deep. The host's
    `jsonsafe.nesting_exceeds` does the same for JSON, but this module also runs as part of the
    standalone program on the standard library alone, without the package. Only the characters that matter
    are visited (found by the regex engine, in C): ordinary text costs next to nothing."""
    depth = 0
    in_string = False
    escaped_at = -1
    for match in _SPECIAL.finditer(text):
        at, char = match.start(), match.group()
        if in_string:
            if at == escaped_at:
                continue
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{(":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif char in "]})" and depth > 0:
            depth -= 1
    return True


def _loads(text: str) -> object:
    """json.loads that returns None instead of raising (depth is checked by the callers' `_depth_ok`)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def arguments_to_call(arguments: object) -> TerminalCall | ParseFailure:
    """The call in a tool call's `arguments` (a dict, or a JSON string of one). Never raises."""
    for _ in range(MAX_STRING_NESTING + 1):
        if not isinstance(arguments, str):
            break
        if len(arguments) > MAX_TEXT_CHARS or not _depth_ok(arguments):
            return ParseFailure("arguments too large or too deeply nested")
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return ParseFailure("arguments are not a JSON object")
    command, final = arguments.get("command"), arguments.get("final_answer")
    if isinstance(command, str) and command.strip():
        return TerminalCall(command=command)
    if isinstance(final, str):
        return TerminalCall(final_answer=final)
    return ParseFailure("arguments have neither a `command` nor a `final_answer` string")


def _from_object(value: object) -> TerminalCall | ParseFailure:
    """A call from a decoded JSON object of any of the accepted shapes."""
    if not isinstance(value, dict):
        return ParseFailure("not a JSON object")
    function = value.get("function")
    if isinstance(function, dict):
        value = function
    name = value.get("name", value.get("tool", TOOL_NAME))
    if name != TOOL_NAME:
        return ParseFailure(f"unknown tool {str(name)[:50]!r}")
    if "arguments" in value:
        return arguments_to_call(value["arguments"])
    if "parameters" in value:
        return arguments_to_call(value["parameters"])
    return arguments_to_call(value)


def _between(text: str, start: str, end: str) -> list[str]:
    """Contents of up to MAX_CANDIDATES `start...end` spans, scanning left to right (linear)."""
    found: list[str] = []
    pos = 0
    while len(found) < MAX_CANDIDATES:
        head = text.find(start, pos)
        if head < 0:
            break
        tail = text.find(end, head + len(start))
        if tail < 0:
            break
        found.append(text[head + len(start) : tail])
        pos = tail + len(end)
    return found


def _fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of fenced code blocks."""
    blocks = []
    for inner in _between(text, "```", "```"):
        first, _, body = inner.partition("\n")
        blocks.append((first.strip().lower(), body))
    return blocks


def _first_json_call(text: str) -> TerminalCall | ParseFailure:
    decoder = json.JSONDecoder()
    pos, tried = 0, 0
    while tried < MAX_CANDIDATES:
        head = text.find("{", pos)
        if head < 0:
            break
        tried += 1
        try:
            value, end = decoder.raw_decode(text, head)
        except (ValueError, RecursionError):
            pos = head + 1
            continue
        parsed = _from_object(value)
        if isinstance(parsed, TerminalCall):
            return parsed
        pos = end
    return ParseFailure("no JSON terminal call")


def _python_call(text: str) -> TerminalCall | ParseFailure:
    """`terminal(command="...")` or `terminal(final_answer='''...''')`: the first string literal after `=`."""
    match = _CALL.search(text)
    if match is None:
        return ParseFailure("no terminal(...) call")
    # Imported here, not at the top: only text-only models reach this path, and these imports would
    # otherwise cost every start of the standalone program.
    import ast
    import io
    import tokenize

    rest = text[match.end() :]
    try:
        token = next(tokenize.generate_tokens(io.StringIO(rest).readline))
        if token.type != tokenize.STRING:
            return ParseFailure("terminal(...) argument is not a string literal")
        value = ast.literal_eval(token.string)
    except (tokenize.TokenError, SyntaxError, ValueError, MemoryError, RecursionError, StopIteration):
        return ParseFailure("terminal(...) argument is not a valid string literal")
    if not isinstance(value, str):
        return ParseFailure("terminal(...) argument is not a string")
    return TerminalCall(command=value) if match.group(1) == "command" else TerminalCall(final_answer=value)


def build_terminal_tool_call(text: object, *, loose: bool = False) -> TerminalCall | ParseFailure:
    """The terminal call in free-form model output, or why there is none. Never raises (see module doc)."""
    if not isinstance(text, str):
        return ParseFailure("not text")
    if len(text) > MAX_TEXT_CHARS:
        return ParseFailure(f"text longer than {MAX_TEXT_CHARS} characters")
    if not _depth_ok(text):
        return ParseFailure(f"brackets nested deeper than {MAX_DEPTH}")
    for inner in _between(text, "<tool_call>", "</tool_call>"):
        parsed = _first_json_call(inner)
        if isinstance(parsed, TerminalCall):
            return parsed
    fences = _fences(text)
    for language, body in fences:
        if language in ("json", "") or body.lstrip().startswith("{"):
            parsed = _first_json_call(body)
            if isinstance(parsed, TerminalCall):
                return parsed
    for candidate in (_python_call(text), _first_json_call(text)):
        if isinstance(candidate, TerminalCall):
            return candidate
    if loose:
        for language, body in fences:
            if language in _SHELL_FENCES and body.strip():
                return TerminalCall(command=body)
        if text.strip():
            return TerminalCall(command=text.strip())
    return ParseFailure("no terminal call found (use the terminal tool)")
