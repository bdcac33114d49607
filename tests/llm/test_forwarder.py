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

FORWARDER = forwarder.__file__


@pytest.fixture
def echo_socket(tmp_path: Path) -> Iterator[str]:
    """A unix socket server that echoes each connection upper-cased until EOF."""
    path = str(tmp_path / "relay.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def run() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data.upper())

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
