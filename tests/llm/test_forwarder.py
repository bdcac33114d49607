"""The in-sandbox forwarder as a sandbox runs it: a plain file under `python3 -I -S`, piping TCP to a unix socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.llm import forwarder
from tests.helpers import wait_until

FORWARDER = forwarder.__file__


@pytest.fixture
def echo_socket(tmp_path: Path) -> Iterator[str]:
    """A unix socket server that echoes each connection upper-cased until EOF."""
    path = str(tmp_path / "relay.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    def run() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield path
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_detached_forwarder_is_listening_when_it_returns(echo_socket: str) -> None:
    port = _free_port()
    # Its own session: the detached child keeps the parent's process group, which the test kills at the end.
    parent = subprocess.Popen([sys.executable, "-I", "-S", FORWARDER, "--detach", echo_socket, str(port)],
                              start_new_session=True, stderr=subprocess.PIPE)
    try:
        _, err = parent.communicate(timeout=30)
        assert parent.returncode == 0, err
        # No retry loop: the parent's exit is the readiness signal.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            payload = os.urandom(300_000).hex().encode()
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
        assert received == payload.upper()
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_forwarder_refuses_bad_arguments_and_a_taken_port(echo_socket: str) -> None:
    bad = subprocess.run([sys.executable, "-I", "-S", FORWARDER, echo_socket], capture_output=True, text=True,
                         timeout=30, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = subprocess.run([sys.executable, "-I", "-S", FORWARDER, "--detach", echo_socket, str(port)],
                              capture_output=True, text=True, timeout=30, check=False)
    assert busy.returncode == 1 and "cannot listen" in busy.stderr


def _start(echo_socket: str, *, nofile: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    limit = ["prlimit", f"--nofile={nofile}", "--"] if nofile else []
    parent = subprocess.Popen([*limit, sys.executable, "-I", "-S", FORWARDER, "--detach", echo_socket, str(port)],
                              start_new_session=True, stderr=subprocess.PIPE)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == 0, err
    return parent, port


def _round_trip(target: int | socket.socket, payload: bytes) -> bytes:
    conn = target if isinstance(target, socket.socket) else socket.create_connection(("127.0.0.1", target), timeout=10)
    with conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
        return received


def _descriptors_run_out(pgid: int, limit: int, deadline_s: float = 20.0) -> bool:
    """Poll (with a deadline) until the detached forwarder of process group `pgid` holds nearly `limit`
    descriptors, or has died trying."""

    def ran_out() -> bool:
        members = [entry for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != pgid
                   and _stat(entry)[1:2] == [str(pgid)]]
        if not members or _stat(members[0])[:1] in (["Z"], []):
            return True
        try:
            return len(os.listdir(f"/proc/{members[0]}/fd")) >= limit - 2
        except FileNotFoundError:
            return True

    return wait_until(ran_out, f"the forwarder to hold {limit - 2} descriptors or die", timeout_s=deadline_s,
                      interval_s=0)


def _stat(pid: str) -> list[str]:
    """(state, pgrp) of a process, or [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return []
    return [fields[0], fields[2]]


def _serves_again(port: int, deadline_s: float = 20.0) -> bool:
    """Poll (with a deadline) until a fresh connection is forwarded end to end."""

    def serves() -> bool:
        try:
            return _round_trip(port, b"ping") == b"PING"
        except OSError:
            return False

    return wait_until(serves, "a fresh connection forwarded end to end", timeout_s=deadline_s, interval_s=0)


def _close_all(conns: list[socket.socket]) -> None:
    for conn in conns:
        conn.close()
    conns.clear()


def test_forwarder_outlives_running_out_of_descriptors(echo_socket: str) -> None:
    """An agent holding more connections open than the forwarder has descriptors for must not cut itself off
    its LLM for the rest of the rollout: once they close, the forwarder serves again."""
    parent, port = _start(echo_socket, nofile=40)
    flood: list[socket.socket] = []
    try:
        for _ in range(forwarder.MAX_CONNECTIONS + 16):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        assert _descriptors_run_out(parent.pid, 40)
        _close_all(flood)
        assert _serves_again(port)
    finally:
        _close_all(flood)
        os.killpg(parent.pid, signal.SIGKILL)


def test_connections_over_the_cap_are_closed_at_once(echo_socket: str) -> None:
    parent, port = _start(echo_socket)
    held: list[socket.socket] = []
    try:
        for _ in range(forwarder.MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        # The last one in the cap is served (and kept open: closing it would free its slot at a moment of the
        # forwarder's choosing), so all were accepted.
        held[-1].sendall(b"x")
        assert held[-1].recv(1) == b"X"
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        held.append(extra)
        assert extra.recv(1) == b""  # refused: closed without being forwarded
        _close_all(held)
        assert _serves_again(port)
    finally:
        _close_all(held)
        os.killpg(parent.pid, signal.SIGKILL)
