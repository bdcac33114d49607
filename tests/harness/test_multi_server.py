"""Trainer-side sessions over several servers: `ServerPool`'s choice (fewest outstanding sessions, ties in turn,
unreachable servers skipped and named), then real servers of ours (uvicorn in threads, the local backend):
`CodingEnvironment` instances and `EpisodeSessionFactory` / `RolloutSessionFactory` sessions given two URLs spread
across both (each server's own session count says so), each staying on its server; an unreachable URL is
skipped, and none reachable is an error naming every server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from coding_agent_env.harness import CodingEnvironment, EpisodeSessionFactory, HarnessError, RolloutSessionFactory
from coding_agent_env.harness import ServerUnreachableError
from coding_agent_env.harness.servers import NoServerError, ServerPool, server_urls
from tests.helpers import dead_url, rollouts_finished, wait_until
from tests.protocol.live import ORACLE_TASK, LiveServer

TASK: dict[str, Any] = {"instruction": "Put 42 in answer.txt.", "verify": ["grep -qx 42 answer.txt"],
                        "sandbox": "local"}




# --- the pool's choice ------------------------------------------------------------------------------------------

def test_server_urls_from_a_list_or_comma_separated() -> None:
    assert server_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    assert server_urls(["http://a:1", "http://b:2,http://a:1"]) == ("http://a:1", "http://b:2")
    with pytest.raises(HarnessError, match="no server URL"):
        server_urls(" , ")
    with pytest.raises(HarnessError, match="string"):
        server_urls([None])  # type: ignore[list-item]


def test_the_least_busy_server_is_chosen_in_turn() -> None:
    pool = ServerPool(["a", "b", "c"])
    assert [pool.acquire() for _ in range(4)] == ["a", "b", "c", "a"]
    pool.release("b")
    assert pool.acquire() == "b"  # the only one with fewer sessions
    pool.release("c")
    pool.release("a")
    assert pool.acquire() == "c"  # a and c tie: c's turn comes first after b
    assert pool.outstanding() == {"a": 1, "b": 1, "c": 1}


def test_open_skips_an_unreachable_server_and_names_all_when_none_answers() -> None:
    pool = ServerPool(["a", "b"])
    down = {"a"}

    def connect(url: str) -> str:
        if url in down:
            raise ServerUnreachableError(f"cannot connect to {url}: refused")
        return f"session on {url}"

    assert pool.open(connect) == ("b", "session on b")
    assert pool.unreachable() == {"a": "cannot connect to a: refused"}
    assert pool.open(connect)[0] == "b"  # a stays out while b answers
    down.add("b")
    with pytest.raises(NoServerError, match=r"a: cannot connect to a: refused; b: cannot connect to b: refused"):
        pool.open(connect)
    assert pool.outstanding() == {"a": 0, "b": 2}  # the failed attempts hold nothing
    down.clear()
    assert pool.open(connect)[0] == "a"  # tried again when none else answers, and back in
    assert pool.unreachable() == {"b": "cannot connect to b: refused"}


def test_a_refusal_other_than_unreachable_is_raised_as_is() -> None:
    pool = ServerPool("a")

    def refuse(url: str) -> str:
        raise HarnessError("CAPACITY_REACHED")

    with pytest.raises(HarnessError, match="CAPACITY_REACHED"):
        pool.open(refuse)
    assert pool.outstanding() == {"a": 0} and pool.unreachable() == {}


# --- real servers -----------------------------------------------------------------------------------------------

def test_coding_environments_spread_across_two_servers_and_stay(make_live: Callable[..., LiveServer]) -> None:
    first, second = make_live(), make_live()
    envs = [CodingEnvironment([first.http, second.http], message_timeout_s=60) for _ in range(4)]
    try:
        for env in envs:
            env.reset(**TASK)
        assert sorted(env.server or "" for env in envs) == sorted([first.http, second.http] * 2)
        assert first.sessions.active == 2 and second.sessions.active == 2
        for env in envs:
            server = env.server
            assert env.terminal("echo 42 > answer.txt") == "[exit code 0]"
            assert env.get_reward() == 1.0
            env.reset(**TASK)  # the next episode on the same connection, so the same server
            assert env.server == server
    finally:
        for env in envs:
            env.__exit__(None, None, None)
    wait_until(lambda: first.sessions.active == 0 and second.sessions.active == 0, "the sessions to end")


def test_episode_sessions_spread_and_release_their_server(make_live: Callable[..., LiveServer]) -> None:
    first, second = make_live(), make_live()
    factory = EpisodeSessionFactory(f"{first.http},{second.http}", message_timeout_s=60)
    sessions = [factory.create(TASK) for _ in range(2)]
    try:
        assert {session.server for session in sessions} == {first.http, second.http}
        assert factory.servers.outstanding() == {first.http: 1, second.http: 1}
    finally:
        for session in sessions:
            session.close()
    assert factory.servers.outstanding() == {first.http: 0, second.http: 0}
    wait_until(lambda: first.sessions.active == 0 and second.sessions.active == 0, "the sessions to end")


def test_rollout_sessions_spread_across_two_servers(make_live: Callable[..., LiveServer]) -> None:
    first, second = make_live(), make_live()
    factory = RolloutSessionFactory([first.http, second.http], defaults={"sandbox": "local"})
    sessions = [factory.create(ORACLE_TASK) for _ in range(2)]
    try:
        assert {session.server for session in sessions} == {first.http, second.http}
        for session in sessions:
            session.wait_for_completion(timeout_s=60)
            assert session.result.reward == 1.0
    finally:
        for session in sessions:
            session.close()
    wait_until(lambda: factory.servers.outstanding() == {first.http: 0, second.http: 0}, "the servers released")
    assert rollouts_finished(first) == 1 and rollouts_finished(second) == 1  # each server ran one (its own counter)


def test_an_unreachable_url_is_skipped(make_live: Callable[..., LiveServer]) -> None:
    live, dead = make_live(), dead_url()
    with CodingEnvironment([dead, live.http], message_timeout_s=60) as env:
        env.reset(**TASK)
        assert env.server == live.http
    assert dead in EpisodeSessionFactory([dead, live.http]).servers.unreachable()  # the process's shared pool


def test_no_reachable_server_is_an_error_naming_each() -> None:
    dead, other = dead_url(), dead_url()
    with CodingEnvironment([dead, other]) as env, pytest.raises(NoServerError) as raised:
        env.reset(**TASK)
    assert f"{dead}: cannot connect to {dead}" in str(raised.value)
    assert f"{other}: cannot connect to {other}" in str(raised.value)
    with pytest.raises(ServerUnreachableError, match=f"cannot connect to {dead}"):
        RolloutSessionFactory([dead, other]).create(ORACLE_TASK)
    single = dead_url()
    with pytest.raises(ServerUnreachableError, match=f"^cannot connect to {single}"):  # one server: its own error
        EpisodeSessionFactory(single).create(TASK)
