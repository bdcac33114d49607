"""llama.cpp's `llama-server` serving the packaged model: where scripts/llama_server.sh caches them, whether they
are built, and starting one server on a loopback port. One place for tests/llm/test_llamacpp.py and
bench/llamacpp.py."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import free_port, wait_until

CACHE = Path(os.environ.get("CAE_LLAMA_CACHE", "/var/cache/cae-llama")) / (
    os.environ.get("CAE_LLAMA_VERSION", "11434.0.0") + "-portable")
"""scripts/llama_server.sh's cache of this version (the portable build's own directory)."""
BINARY = CACHE / "llama-server"
MODEL = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = CACHE / "chatml-tools.jinja"
MODEL_NAME = "smollm2-135m"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]

BUILD_WAIT_S = float(os.environ.get("CAE_LLAMA_WAIT_S", "1800"))
"""How long to wait for a build in progress (scripts/llama_server.sh holds its cache's lock while it builds)."""


def built(wait_s: float = BUILD_WAIT_S) -> bool:
    """Whether the binary, model and template are there, after waiting up to `wait_s` for a build in progress."""
    lock = CACHE / ".lock"
    if lock.exists():
        deadline = time.monotonic() + wait_s
        with open(lock, "rb") as held:
            while True:
                try:
                    fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    fcntl.flock(held, fcntl.LOCK_UN)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(min(2.0, max(0.0, wait_s)))
    return BINARY.is_file() and MODEL.is_file() and TEMPLATE.is_file()


@contextmanager
def llama_server(threads: int | None = None) -> Iterator[str]:
    """llama-server on 127.0.0.1 (a free port), one slot, the packaged model, its log in $TMPDIR (removed at the end
    unless something failed); yields its base URL (no `/v1`) once healthy; ended by its PID (its process group) at
    the end. Needs `built()`."""
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [str(BINARY), "-m", str(MODEL), "--jinja", "--chat-template-file", str(TEMPLATE), "-c", "32768", "-np", "1",
         "--override-kv", "llama.context_length=int:32768", "--host", "127.0.0.1", "--port", str(port),
         "-t", str(threads or min(2, os.cpu_count() or 1)), "--alias", MODEL_NAME, "--no-webui"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"llama-server exited {process.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    failed = True
    try:
        wait_until(healthy, "llama-server healthy", timeout_s=120, interval_s=0.5)
        yield f"http://127.0.0.1:{port}"
        failed = False
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        if not failed:  # kept only when something went wrong: the error names it
            os.unlink(log.name)
