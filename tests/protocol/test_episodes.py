"""Interactive episodes over the Gym API: WS `/ws` reset/step/state, and JSON-RPC attached over WS (Gen B)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import Client
from websockets.sync.client import ClientConnection, connect

from coding_agent_env.harness import EpisodeSessionFactory, HarnessError
from coding_agent_env.settings import Settings, WireLimits
from tests.helpers import leftovers, sandbox_dirs, sandbox_processes, wait_until
from tests.protocol.live import LiveServer
from tests.protocol.test_ws import ask

TASK: dict[str, Any] = {
    "instruction": "Put 42 in answer.txt, then answer 42.",
    "setup_scripts": "mkdir -p work",
    "verify_scripts": ["", "test \"$(cat \"$FINAL_ANSWER_FILE\")\" = 42", "grep -qx 42 work/answer.txt"],
    "sandbox_backend": "local",
}


@pytest.fixture
def live(make_server: Callable[..., LiveServer], settings: Settings) -> LiveServer:
    return make_server(state_dir=settings.state_dir, backends=settings.backends)


def terminal(command: str = "", final_answer: str = "") -> dict[str, Any]:
    """As upstream sends it: both keys, one empty."""
    arguments = {"command": command, "final_answer": final_answer}
    return {"type": "step", "data": {"type": "call_tool", "tool_name": "terminal", "arguments": arguments}}


def tool_names(ws: ClientConnection) -> list[str]:
    reply = ask(ws, {"type": "step", "data": {"type": "list_tools"}})
    return [tool["name"] for tool in reply["data"]["observation"]["tools"]]


def test_an_episode_over_ws(live: LiveServer, settings: Settings) -> None:
    with connect(live.ws) as ws:
        assert tool_names(ws) == ["run_rollout"]
        opened = ask(ws, {"type": "reset", "data": {"seed": 1, "episode_id": "ep-7", **TASK}})["data"]
        assert opened["done"] is False and opened["reward"] is None
        observation = opened["observation"]
        assert observation["instruction"] == TASK["instruction"]
        assert observation["episode"]["status"] == "running" and observation["episode"]["episode_id"] == "ep-7"
        assert [r["cmd"] for r in observation["episode"]["setup_results"]] == ["mkdir -p work"]
        assert [t["name"] for t in observation["tools"]] == ["run_rollout", "terminal", "keystrokes"]
        assert observation["text"].startswith(TASK["instruction"])
        assert tool_names(ws) == ["run_rollout", "terminal", "keystrokes"]
        step = ask(ws, terminal("cd work && echo 42 > answer.txt && export X=7"))["data"]
        assert step["done"] is False and step["observation"]["error"] is None
        result = step["observation"]["result"]
        assert result["data"]["exit_code"] == 0 and result["content"][0]["text"] == "[exit code 0]"
        again = ask(ws, terminal("echo $X $(cat answer.txt); pwd"))["data"]["observation"]["result"]["data"]
        assert again["output"].splitlines()[0] == "7 42" and again["output"].rstrip().endswith("/work")
        state = ask(ws, {"type": "state"})["data"]
        assert state["episode_id"] == "ep-7" and state["step_count"] == 3
        episode = state["episode"]
        assert episode["status"] == "running" and episode["isolation"] == "bwrap" and episode["network"] == "none"
        assert [c["exit_code"] for c in episode["commands"]] == [0, 0] and episode["sandbox_id"]
        final = ask(ws, terminal(final_answer="42"))["data"]
        assert final["done"] is True and final["reward"] == 1.0
        text = final["observation"]["result"]["content"][0]["text"]
        assert text == "Episode completed: 2/2 verify commands passed; reward 1"
        assert final["observation"]["result"]["data"]["status"] == "completed"
        after = ask(ws, terminal("true"))["data"]["observation"]["error"]
        assert after["error_type"] == "execution_error" and "has ended (completed)" in after["message"]
        assert tool_names(ws) == ["run_rollout"]
        assert ask(ws, {"type": "state"})["data"]["last_reward"] == 1.0
        assert not leftovers(settings)


def test_bad_input_is_that_calls_error(live: LiveServer, settings: Settings) -> None:
    with connect(live.ws) as ws:
        before = ask(ws, terminal("ls"))["data"]["observation"]["error"]
        assert before["error_type"] == "execution_error" and "call reset with a task" in before["message"]
        bad_reset = ask(ws, {"type": "reset", "data": {"setup_scripts": 5, "instruction": "x"}})
        assert bad_reset["type"] == "error" and bad_reset["data"]["code"] == "EXECUTION_ERROR"
        assert "setup_scripts must be a string or a list" in bad_reset["data"]["message"]
        assert "Traceback" not in bad_reset["data"]["message"]
        wrong = ask(ws, {"type": "reset", "data": {"instruction": "x", "api_key": "sk-SECRET-123456"}})
        assert "unknown task field(s): api_key" in wrong["data"]["message"] and "SECRET" not in json.dumps(wrong)
        over = ask(ws, {"type": "reset", "data": {"instruction": "x", "limits": {"memory_mb": 10**7}}})
        assert "SANDBOX_MEMORY_MB" in over["data"]["message"]
        assert ask(ws, {"type": "reset", "data": TASK})["data"]["done"] is False
        for arguments, kind, words in [
            (terminal("ls", "42")["data"]["arguments"], "invalid_args", "not both"),
            ({"command": "", "final_answer": ""}, "invalid_args", "both are empty"),
            ({"command": 5}, "invalid_args", "command must be a string, not int"),
            ({"command": "echo a\x00b"}, "invalid_args", "NUL"),
            ({"command": "x" * (WireLimits.MAX_COMMAND_BYTES + 1)}, "invalid_args", "longer than"),
        ]:
            frame = {"type": "step", "data": {"type": "call_tool", "tool_name": "terminal", "arguments": arguments}}
            error = ask(ws, frame)["data"]["observation"]["error"]
            assert error["error_type"] == kind and words in error["message"], error
        unknown = ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "shell", "arguments": {}}})
        assert unknown["data"]["observation"]["error"]["error_type"] == "tool_not_found"
        # The episode is still usable.
        ok = ask(ws, terminal("echo fine"))["data"]["observation"]["result"]["data"]
        assert ok["output"] == "fine\n" and ok["exit_code"] == 0
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the episode torn down")


def test_setup_failure_and_a_second_reset(live: LiveServer, settings: Settings) -> None:
    with connect(live.ws) as ws:
        failed = ask(ws, {"type": "reset", "data": {**TASK, "setup_scripts": ["exit 4"]}})["data"]
        assert failed["done"] is True and failed["reward"] is None
        assert failed["observation"]["episode"]["status"] == "setup_failed"
        assert failed["observation"]["episode"]["setup_results"][0]["exit_code"] == 4
        assert [t["name"] for t in failed["observation"]["tools"]] == ["run_rollout"]
        assert not leftovers(settings)
        first = ask(ws, {"type": "reset", "data": TASK})["data"]["observation"]["episode"]["sandbox_id"]
        second = ask(ws, {"type": "reset", "data": TASK})["data"]["observation"]["episode"]["sandbox_id"]
        assert first != second and len(sandbox_dirs(settings)) == 1  # the first one's sandbox is gone
        ask(ws, {"type": "reset"})  # a bare reset ends it too
        assert tool_names(ws) == ["run_rollout"] and not leftovers(settings)


def test_disconnect_mid_command_tears_down(live: LiveServer, settings: Settings) -> None:
    with connect(live.ws) as ws:
        ask(ws, {"type": "reset", "data": TASK})
        ws.send(json.dumps(terminal("sleep 60")))
        wait_until(lambda: any("sleep 60" in p for p in sandbox_processes(settings)), what="the command running")
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the episode torn down")


def test_gen_b_attached_jsonrpc(live: LiveServer, settings: Settings) -> None:
    """OpenEnv Gen B's way: session over HTTP, reset over the attached WS, tools over HTTP JSON-RPC."""
    with httpx.Client(base_url=live.http, timeout=60) as http:
        def rpc(method: str, **params: Any) -> dict[str, Any]:
            return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

        session_id = rpc("openenv/session/create")["result"]["session_id"]
        with connect(f"{live.ws}?session_id={session_id}") as ws:
            assert [t["name"] for t in rpc("tools/list", session_id=session_id)["result"]["tools"]] == ["run_rollout"]
            ask(ws, {"type": "reset", "data": TASK})
            tools = rpc("tools/list", session_id=session_id)["result"]["tools"]
            assert [t["name"] for t in tools] == ["run_rollout", "terminal", "keystrokes"] and "inputSchema" in tools[1]
            ran = rpc("tools/call", session_id=session_id, name="terminal",
                      arguments={"command": "echo 42 > work/answer.txt; echo done", "final_answer": ""})
            assert ran["result"]["data"]["output"] == "done\n"
            final = rpc("tools/call", session_id=session_id, name="terminal",
                        arguments={"command": "", "final_answer": "42"})
            assert final["result"]["content"][0]["text"] == "Episode completed: 2/2 verify commands passed; reward 1"
            assert ask(ws, {"type": "state"})["data"]["episode"]["reward"] == 1.0
            ended = rpc("tools/call", session_id=session_id, name="terminal", arguments={"command": "ls"})
            assert ended["error"]["code"] == -32603 and "has ended" in ended["error"]["message"]
            stateless = rpc("tools/call", name="terminal", arguments={"command": "ls"})
            assert "needs a session_id" in stateless["error"]["message"]
        # The server may not have seen the socket go yet: then the close is taken and done at the detach.
        closed = rpc("openenv/session/close", session_id=session_id)["result"]
        assert closed["closed"] is True or closed["closing"] is True, closed
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the session closed")


def test_shutdown_tears_down_live_episodes(make_server: Callable[..., LiveServer], settings: Settings) -> None:
    server = make_server(state_dir=settings.state_dir, backends=settings.backends)
    with connect(server.ws) as ws:
        ask(ws, {"type": "reset", "data": TASK})
        assert leftovers(settings)  # the episode's sandbox exists
        server.stop()
    assert not leftovers(settings)


async def test_an_episode_through_the_official_mcp_client(live: LiveServer, settings: Settings) -> None:
    async with Client(f"{live.http}/mcp") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["terminal"].input_schema["properties"].keys() == {"command", "final_answer"}
        assert {"instruction", "setup_scripts", "verify_scripts", "sandbox_backend", "limits"} <= set(
            tools["start_episode"].input_schema["properties"])
        early = await client.call_tool("terminal", {"command": "ls", "final_answer": ""})
        assert early.is_error and "call reset with a task" in early.content[0].text
        started = await client.call_tool("start_episode", TASK)
        assert not started.is_error and started.structured_content["episode"]["status"] == "running"
        assert started.content[0].text.startswith(TASK["instruction"])
        bad = await client.call_tool("start_episode", {"instruction": "x", "setup_scripts": 1})
        assert bad.is_error and "setup_scripts must be" in bad.content[0].text
        over = await client.call_tool("start_episode", {"instruction": "x", "limits": {"max_processes": 10**6}})
        assert over.is_error and "SANDBOX_MAX_PROCESSES" in over.content[0].text
        elsewhere = await client.call_tool("start_episode", {"instruction": "x", "sandbox": "docker"})
        assert elsewhere.is_error and "not enabled" in elsewhere.content[0].text
        # The failed start left the running episode alone.
        ran = await client.call_tool("terminal", {"command": "echo 42 > work/answer.txt; echo ok", "final_answer": ""})
        assert not ran.is_error and ran.structured_content["output"] == "ok\n"
        assert ran.content[0].text == "ok\n[exit code 0]"
        both = await client.call_tool("terminal", {"command": "ls", "final_answer": "42"})
        assert both.is_error and "not both" in both.content[0].text
        final = await client.call_tool("terminal", {"command": "", "final_answer": "42"})
        assert final.structured_content["reward"] == 1.0 and final.structured_content["done"] is True
        assert final.content[0].text == "Episode completed: 2/2 verify commands passed; reward 1"
        assert not leftovers(settings)
        await client.call_tool("start_episode", TASK)  # left live: the session's end tears it down
        assert leftovers(settings)
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the MCP session's episode gone")


def test_the_trainer_side_session(live: LiveServer, settings: Settings) -> None:
    factory = EpisodeSessionFactory(live.http, defaults={"command_timeout_s": 30}, message_timeout_s=60)
    with pytest.raises(HarnessError, match="EXECUTION_ERROR: unknown task field"):
        factory.create({**TASK, "bogus": 1})
    wait_until(lambda: live.sessions.active == 0, what="the refused session closed")
    session = factory.create(TASK, episode_id="trainer-1")
    assert session.episode_id == "trainer-1" and [t.name for t in session.list_tools()] == ["terminal"]
    with pytest.raises(KeyError):
        session.call_tool("run_rollout", {})
    with pytest.raises(KeyError):
        session.call_tool("reset", {})
    assert session.verify([]).env_reward is None  # never scored
    refused = session.call_tool("terminal", {"command": 3})
    assert refused.error and "must be a string" in refused.data and not refused.done
    ran = session.call_tool("terminal", {"command": "echo hi", "final_answer": ""})
    assert ran.data == "hi\n[exit code 0]" and "reward" not in ran.metadata
    session.close()
    session.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the episode torn down")
    with pytest.raises(HarnessError, match="closed"):
        session.call_tool("terminal", {"command": "ls"})


def test_an_episode_holds_its_sessions_slot(make_server: Callable[..., LiveServer], settings: Settings) -> None:
    server = make_server(state_dir=settings.state_dir, backends=settings.backends, max_concurrent_envs=1)
    with connect(server.ws) as ws:
        ask(ws, {"type": "reset", "data": TASK})
        with connect(server.ws) as second:
            refused = json.loads(second.recv(timeout=10))
            assert refused["data"]["code"] == "CAPACITY_REACHED"
        create = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}
        assert httpx.post(f"{server.http}/mcp", json=create).json()["error"]["code"] == -32000
        # Over the same socket's `mcp` envelope, the episode's terminal is a tool of this session.
        listed = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}})
        assert [t["name"] for t in listed["data"]["result"]["tools"]] == ["run_rollout", "terminal", "keystrokes"]
        call = {"name": "terminal", "arguments": {"command": "echo via-mcp"}}
        ran = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call}})
        assert ran["data"]["result"]["data"]["output"] == "via-mcp\n"
    wait_until(lambda: server.sessions.active == 0 and not leftovers(settings), what="the episode torn down")


def test_episodes_ended_every_way_over_ws_leave_nothing(make_server: Callable[..., LiveServer],
                                                         settings: Settings) -> None:
    """40 episodes over WS, ended by final answer, disconnect, a `close` frame, a second reset, the idle
    timeout; nothing of any is left. The idle ones are left waiting from the start while the others run, so
    the idle timeout can be seconds: a loaded machine's pause between two calls does not expire an episode."""
    server = make_server(state_dir=settings.state_dir, backends=settings.backends, episode_idle_timeout_s=3.0,
                         max_concurrent_envs=9)
    ended = []
    with contextlib.ExitStack() as stack:
        idle = [stack.enter_context(connect(server.ws)) for _ in range(8)]
        for ws in idle:
            ask(ws, {"type": "reset", "data": TASK})
            ask(ws, terminal("sleep 300 & echo 42 > work/answer.txt"))
        for index in range(32):
            way = index % 4
            with connect(server.ws) as ws:
                ask(ws, {"type": "reset", "data": TASK})
                ask(ws, terminal("sleep 300 & echo 42 > work/answer.txt"))
                if way == 0:
                    ended.append(ask(ws, terminal(final_answer="42"))["data"]["reward"])
                elif way == 2:
                    ws.send(json.dumps({"type": "close"}))
                elif way == 3:
                    ask(ws, {"type": "reset", "data": TASK})
        for ws in idle:
            wait_until(lambda: ask(ws, {"type": "state"})["data"]["episode"]["status"] == "expired",  # noqa: B023
                       what="the idle timeout")
    assert ended == [1.0] * 8
    wait_until(lambda: server.sessions.active == 0 and not leftovers(settings), what="every episode torn down")
