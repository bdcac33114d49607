"""`sandbox.docker.records`: what a server made is recorded under the state dir and forgotten as it goes; only
the records of servers that are gone (pid dead, or reused by a process started at another time) are the
reaper's, and nothing but well-formed records in them is read (a link or a stray name is ignored)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coding_agent_env.sandbox.docker.records import RECORD_DIR, Made, dead_records, new_name

IMAGE = "sha256:" + "ab" * 32
DEAD_PID = 2**22 + 1
"""Above the largest pid_max Linux allows: never a live process."""


def test_a_live_servers_records_are_never_the_reapers(tmp_path: Path) -> None:
    made = Made(tmp_path)
    name = new_name()
    made.add("c", name)
    made.add("i", IMAGE)
    assert dead_records(tmp_path) == []  # this process is alive
    made.forget("c", name)
    made.forget("i", IMAGE)
    assert list(made.dir.iterdir()) == []


def test_a_dead_or_reused_pid_s_records_are_read_containers_first(tmp_path: Path) -> None:
    root = tmp_path / RECORD_DIR
    dead, reused = root / f"{DEAD_PID}-1", root / f"{os.getpid()}-1"  # this pid, another start time
    name = new_name()
    for server in (dead, reused):
        server.mkdir(parents=True)
        (server / f"i-{'ab' * 32}").touch()
        (server / f"c-{name}").touch()
        (server / "c-not-an-id").touch()  # not a record: ignored
        (server / f"c-{'cd' * 32}").symlink_to("/etc/passwd")  # a link: ignored
    (root / "not-a-server").mkdir()
    records = sorted(dead_records(tmp_path), key=lambda record: record.dir.name)
    assert [record.dir for record in records] == sorted([dead, reused], key=lambda p: p.name)
    assert all(record.objects == (("c", name), ("i", "ab" * 32)) for record in records)


def test_only_engine_ids_and_our_names_are_recorded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an engine object id"):
        Made(tmp_path).add("c", "../escape")


def test_a_record_whose_start_time_was_unknown_is_the_reapers_only_once_its_pid_is_gone(tmp_path: Path) -> None:
    """`Made` names its directory `<pid>-0` when /proc could not tell its start time: such a record is taken as
    alive while its pid is (a live server's containers are never reaped), and is the reaper's once it is gone."""
    root = tmp_path / RECORD_DIR
    live, dead = root / f"{os.getpid()}-0", root / f"{DEAD_PID}-0"
    for server in (live, dead):
        server.mkdir(parents=True)
        (server / f"c-{new_name()}").touch()
    assert [record.dir for record in dead_records(tmp_path)] == [dead]
