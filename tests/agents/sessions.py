"""Scripted LLM sessions for the agent suite: what a model would say to each agent, tool calls included.

Each agent has its own tool for running a shell command (OpenCode's and Pi's `bash`, Qwen Code's
`run_shell_command`, Terminus's
`terminal`) and its own way of finishing (a plain answer, or Terminus's `final_answer`)."""

from __future__ import annotations

import json

from tests.fakes.llm import Reply

AGENTS = ("opencode", "pi", "terminus", "qwen-code", "mini-swe-agent", "claude-code", "codex", "gemini-cli")

CORRECT = '''def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
'''

WRONG = '''def binary_search(items, target):
    return 0
'''

TASK = "Create binary_search.py defining binary_search(items, target): the index of target in the sorted list items, or -1."
VERIFY = [
    # Hardened verify does not import from the working directory by itself: the check puts it on the path.
    "python3 -c 'import sys; sys.path.insert(0, \"\"); from binary_search import binary_search as b; "
    "assert b([1, 3, 5, 7, 9], 7) == 3 and b([1, 3], 4) == -1 and b([], 1) == -1 and b([2], 2) == 0'"
]


def write_file_command(path: str, text: str) -> str:
    return f"cat > {path} <<'EOF'\n{text}EOF\n"


def run_command(agent: str, command: str, note: str = "Running a command.") -> Reply:
    """A reply that makes `agent` run `command` in its shell tool."""
    if agent == "terminus":
        call = ("terminal", json.dumps({"command": command}))
    elif agent == "opencode":
        call = ("bash", json.dumps({"command": command, "description": "run a command"}))
    elif agent == "claude-code":
        call = ("Bash", json.dumps({"command": command, "description": "run a command"}))
    elif agent == "codex":
        call = ("exec_command", json.dumps({"cmd": command}))
    elif agent == "gemini-cli":
        call = ("run_shell_command", json.dumps({"command": command}))
    elif agent == "qwen-code":
        call = ("run_shell_command", json.dumps({"command": command, "is_background": False}))
    else:
        call = ("bash", json.dumps({"command": command}))
    return Reply(content=note, tool_calls=(call,))


def finish(agent: str, text: str = "done") -> Reply:
    """A reply that ends `agent`'s session."""
    if agent == "terminus":
        return Reply(content=None, tool_calls=(("terminal", json.dumps({"final_answer": text})),))
    if agent == "mini-swe-agent":
        return Reply(content=text, tool_calls=(("bash", json.dumps({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})),))
    return Reply(content=text)


def session(agent: str, *commands: str) -> list[Reply]:
    return [*(run_command(agent, command) for command in commands), finish(agent)]
