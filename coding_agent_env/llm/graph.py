"""The rollout graph: a rollout's LLM calls linked into trees by prefix, each call classified.

A call's *parent* is the call it continues: the one whose prompt followed by its completion is a prefix of
this call's prompt, as token ids (the engine's own tokenization: `prompt_token_ids` and the sampled ids).
When several earlier calls qualify, the longest wins (the nearest ancestor). A call whose upstream returned
no ids is linked the same way by messages (its request's messages against an earlier call's messages plus its
reply, tool-call arguments compared as canonical JSON since agents re-serialise them) and is never trainable.

A call that continues nothing is a *root*. Purposes:

- `main`: the agent's main line, the longest root-to-leaf path of the agent's first tree that has tools;
- `retry`: a call off that line with no children whose parent has another child that did continue;
- `compaction`: a later root with the main tree's first message (its system prompt) and tools: the agent's
  conversation restarted from a rewritten history; its descendants are `main` again;
- `subagent`: any other root with tools, and its descendants;
- `auxiliary`: a call without tools while the main line has them (a title, a summary), or any call of a tree
  without tools when another tree has them.

Building is linear in the total prompt length for a conversation that only grows (each call is compared with
the most recent candidates first), and runs once per rollout when its result is rendered, never per call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coding_agent_env.models import Turn, TurnPurpose

__all__ = ["Node", "RolloutGraph", "build_graph", "full_prompts"]


@dataclass
class Node:
    """One call in the graph. `context` is what the call continued on: prompt plus completion, as ids or as
    canonical message strings."""

    turn: Turn
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    by_ids: bool
    context: list[Any]
    prompt_len: int
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    purpose: TurnPurpose = "main"
    logps_ok: bool = False
    """Set by `llm.trace.annotate`: the call's logprobs can be trained on."""


@dataclass
class RolloutGraph:
    nodes: list[Node]
    """In turn order; `nodes[i].turn.turn == i` is not assumed (use `index`)."""
    index: dict[int, int]
    """Turn number -> position in `nodes`."""

    def roots(self) -> list[Node]:
        return [node for node in self.nodes if node.parent is None]

    def paths(self) -> list[list[Node]]:
        """Every root-to-leaf path, roots in turn order, children in turn order."""
        out: list[list[Node]] = []
        for root in self.roots():
            stack: list[list[Node]] = [[root]]
            while stack:
                path = stack.pop()
                children = [self.nodes[self.index[c]] for c in path[-1].children]
                if not children:
                    out.append(path)
                stack.extend([*path, child] for child in reversed(children))
        return out


def full_prompts(turns: Sequence[Turn]) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Each call's whole request messages and tools, undoing the relay's incremental recording (`Turn`)."""
    out: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    for turn in sorted(turns, key=lambda t: t.turn):
        messages = [*messages[: turn.request_messages_reused], *turn.request_messages]
        tools = tools if turn.request_tools_reused else turn.request_tools
        out.append((messages, tools))
    return out


def build_graph(turns: Sequence[Turn]) -> RolloutGraph:
    """Link and classify `turns` (as recorded by the relay). Total: any turns make a graph."""
    ordered = sorted(turns, key=lambda t: t.turn)
    nodes: list[Node] = []
    for turn, (messages, tools) in zip(ordered, full_prompts(ordered)):
        by_ids = bool(turn.prompt_token_ids)
        if by_ids:
            prompt: list[Any] = list(turn.prompt_token_ids or [])
            context = prompt + list(turn.completion_token_ids)
        else:
            prompt = [_canonical(m) for m in messages]
            context = prompt + [_canonical(_reply(turn))]
        nodes.append(Node(turn, messages, tools, by_ids, context, len(prompt)))
    index = {node.turn.turn: i for i, node in enumerate(nodes)}
    for i, node in enumerate(nodes):
        parent = _parent(nodes, i)
        if parent is not None:
            node.parent = nodes[parent].turn.turn
            nodes[parent].children.append(node.turn.turn)
    graph = RolloutGraph(nodes, index)
    _classify(graph)
    return graph


def _parent(nodes: list[Node], i: int) -> int | None:
    node = nodes[i]
    prompt = node.context[: node.prompt_len]
    best: int | None = None
    best_len = -1
    # Most recent first: in a growing conversation the previous call is the parent and the scan stops there.
    for j in range(i - 1, -1, -1):
        other = nodes[j]
        if other.by_ids != node.by_ids:
            continue
        size = len(other.context)
        if size <= best_len or size > len(prompt) or size == 0:
            continue
        if prompt[:size] == other.context:
            best, best_len = j, size
            if size == len(prompt):
                break
    return best


def _classify(graph: RolloutGraph) -> None:
    nodes = graph.nodes
    if not nodes:
        return
    roots = graph.roots()
    tooled = [root for root in roots if root.tools]
    main_root = tooled[0] if tooled else roots[0]
    any_tools = bool(tooled)
    for root in roots:
        if root is main_root:
            kind: TurnPurpose = "main"
        elif any_tools and not root.tools:
            kind = "auxiliary"
        elif root.tools and _first(root) == _first(main_root) and root.turn.turn > main_root.turn.turn:
            kind = "compaction"
        elif root.tools:
            kind = "subagent"
        else:
            kind = "auxiliary"
        _mark_tree(graph, root, kind, any_tools)


def _mark_tree(graph: RolloutGraph, root: Node, kind: TurnPurpose, any_tools: bool) -> None:
    """Give `root` its kind and its tree `main` / `subagent` / `auxiliary` / `retry` along its longest path."""
    line_kind: TurnPurpose = "main" if kind in ("main", "compaction") else kind
    longest = _longest_path(graph, root)
    on_line = {id(node) for node in longest}
    stack = [root]
    while stack:
        node = stack.pop()
        children = [graph.nodes[graph.index[c]] for c in node.children]
        stack.extend(children)
        if node is root:
            node.purpose = kind
        elif any_tools and not node.tools:
            node.purpose = "auxiliary"
        elif id(node) in on_line or node.children:
            node.purpose = line_kind
        else:
            node.purpose = "retry"


def _longest_path(graph: RolloutGraph, root: Node) -> list[Node]:
    best: list[Node] = []
    stack: list[list[Node]] = [[root]]
    while stack:
        path = stack.pop()
        children = [graph.nodes[graph.index[c]] for c in path[-1].children]
        if not children and len(path) >= len(best):  # ties: the later leaf (pushed first, popped last)
            best = path
        stack.extend([*path, child] for child in children)
    return best


def _first(node: Node) -> str:
    return _canonical(node.messages[0]) if node.messages else ""


def _reply(turn: Turn) -> dict[str, Any]:
    """The assistant message a call returned, shaped as an agent sends it back in its next prompt."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.message.content}
    if turn.message.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.message.tool_calls
        ]
    return message


def _canonical(message: Any) -> str:
    """A message in a form that survives an agent re-sending it: role, text and tool calls (arguments as
    canonical JSON), without fields agents add or drop (names, reasoning, cache hints)."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    content = message.get("content")
    if isinstance(content, list):  # multi-part: the text parts, in order
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    calls = []
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            calls.append([function.get("name"), _canonical_arguments(function.get("arguments"))])
    return json.dumps([message.get("role"), content or "", calls, message.get("tool_call_id")], sort_keys=True)


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), sort_keys=True)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, default=str)
