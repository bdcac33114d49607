"""The relay: the server-side OpenAI-compatible endpoint every agent talks to.

One `Relay` per server process, started on the server's event loop. It listens on its own loopback TCP port
(127.0.0.1, OS-chosen) and on a unix socket under `Settings.state_dir` (for sandboxes without network),
never on the public port. Routes, each requiring a lease's bearer token (401 otherwise):

    POST /v1/chat/completions   forwarded to the lease's upstream with the server-held key; turn recorded
    POST a dialect's path       every dialect in `llm.dialects.DIALECTS` (Anthropic `/v1/messages`, Responses
                                `/v1/responses`, Google `/v1beta/models/M:generateContent`), the token also in
                                the dialect's key header: translated to and from chat completions, or passed
                                through to an upstream that serves it (`Upstream.native_dialects`); turn
                                recorded the same way (`llm.answers`)
    GET  /v1/models             the lease's model, answered locally

`serve_listener(sock)` serves the same routes on a listening socket made elsewhere: the local backend makes
one inside an agent's own network namespace, so the agent reaches the relay over that namespace's loopback
with no forwarder process and no extra hop.

Lifecycle: `start()` once, `open_lease()` per rollout, `lease.close()` as soon as the rollout's agent is done,
`stop()` at shutdown (closes every lease). All methods must be called on the loop that ran `start()`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from coding_agent_env.errors import RelayError
from coding_agent_env.llm.answers import relay_call
from coding_agent_env.llm.dialects import Route, route_of
from coding_agent_env.llm.lease import Lease
from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.llm.inbound import bearer_token, error_in, error_response, parse_json_object
from coding_agent_env.pids import pid_alive
from coding_agent_env.settings import Settings

__all__ = ["Relay", "RelayState"]

log = logging.getLogger(__name__)

_SOCKET_DIR = "relay"
_MAX_UNIX_PATH = 107
_TOKEN_PREFIX = "car-"
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
_MODEL_PATHS = frozenset({"/v1/models", "/models"})


class RelayState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class Relay:
    """See the module docstring. Use as `async with Relay(settings) as relay:` or `start()`/`stop()`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._state = RelayState.NEW
        self._leases: dict[str, Lease] = {}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None
        self._socket_path = settings.state_dir / _SOCKET_DIR / f"{os.getpid()}-{secrets.token_hex(4)}.sock"

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind both listeners and open the upstream connection pool. `RelayError` if they cannot be made."""
        if self._state is not RelayState.NEW:
            raise RelayError(f"relay cannot start: it is {self._state.value}")
        self._state = RelayState.RUNNING
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        if len(str(self._socket_path)) > _MAX_UNIX_PATH:
            raise RelayError(f"state dir path too long for a unix socket: {self._socket_path}")
        app = web.Application(client_max_size=self._settings.relay_max_body_bytes, handler_args={"access_log": None})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
        tcp.bind(("127.0.0.1", 0))
        self._port = tcp.getsockname()[1]
        await web.SockSite(self._runner, tcp).start()
        _prepare_socket_dir(self._socket_path.parent)
        await web.UnixSite(self._runner, str(self._socket_path)).start()
        os.chmod(self._socket_path, 0o666)  # sandbox uids must connect; the token is the access control
        connector = aiohttp.TCPConnector(limit=self._settings.relay_max_connections, enable_cleanup_closed=False)
        # No cookie jar: an upstream's cookies must not be shared between rollouts. No proxies from env.
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=True, trust_env=False
        )

    async def stop(self) -> None:
        """Close every lease, stop listening, remove the socket. Idempotent."""
        if self._state is RelayState.STOPPED:
            return
        self._state = RelayState.STOPPED
        for lease in list(self._leases.values()):
            await lease.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self._socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> Relay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def state(self) -> RelayState:
        return self._state

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1`: the loopback listener."""
        self._check_running()
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def socket_path(self) -> Path:
        """The unix socket serving the same routes (mode 0666; the token is the access control)."""
        return self._socket_path

    # -- leases --------------------------------------------------------------------------------------------

    async def open_lease(self, rollout_id: str, upstream: Upstream, *, ttl_s: float | None = None) -> Lease:
        """A new lease for one rollout: a fresh unguessable token bound to `upstream`, optionally expiring
        `ttl_s` seconds from now. `RelayError` unless the relay is running."""
        self._check_running()
        token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        lease = Lease(
            rollout_id,
            upstream,
            token=token,
            base_url=self.base_url,
            socket_path=self._socket_path,
            expires_at=None if ttl_s is None else time.monotonic() + ttl_s,
            revoke=self._revoke,
            serve=self.serve_listener,
        )
        self._leases[token] = lease
        return lease

    async def serve_listener(self, sock: socket.socket) -> Callable[[], Awaitable[None]]:
        """Serve every route (same tokens, same caps) on `sock` too, a TCP socket the caller made and bound
        (serving listens on it), possibly in another network namespace (a socket stays in the namespace it was
        made in).
        The relay owns `sock` from the call on, whatever happens. Returns `stop`: stop listening on it and
        close it; idempotent, and harmless after the relay itself stopped (which stops it too).
        `RelayError` unless the relay is running."""
        try:
            self._check_running()
            assert self._runner is not None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
            site = web.SockSite(self._runner, sock)
            await site.start()
        except BaseException:
            sock.close()
            raise
        runner = self._runner

        async def stop() -> None:
            if site in runner.sites:  # else already stopped, by an earlier stop() or the relay's own
                await site.stop()
            sock.close()

        return stop

    def accepts(self, token: str) -> bool:
        """Whether `token` is a live lease's: what the public route checks before it forwards anything."""
        lease = self._leases.get(token)
        return lease is not None and lease.usable()

    def _revoke(self, token: str) -> None:
        self._leases.pop(token, None)

    def _check_running(self) -> None:
        if self._state is not RelayState.RUNNING:
            raise RelayError(f"relay is {self._state.value}, not running")

    # -- HTTP ----------------------------------------------------------------------------------------------

    def _authorize(self, request: web.BaseRequest) -> Lease | None:
        token = bearer_token(request)
        lease = self._leases.get(token) if token is not None else None
        if lease is None or not lease.usable():
            return None
        return lease

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        lease = self._authorize(request)
        path = request.path.rstrip("/")
        route = route_of(path)
        if lease is None:
            dialect = route.dialect if route is not None else None
            return error_in(dialect, 401, "invalid, expired or revoked relay token", "authentication_error")
        if request.method == "POST" and (route is not None or path in _CHAT_PATHS):
            return await self._call(request, lease, route)
        if path in _MODEL_PATHS and request.method == "GET":
            return _models(lease)
        return error_response(404, f"no route {request.method} {path}", "not_found")

    async def _call(self, request: web.Request, lease: Lease, route: Route | None) -> web.StreamResponse:
        """One POST in chat completions (`route` None) or a dialect, within the lease's caps."""
        if lease.calls_started >= self._settings.relay_max_turns:
            return error_response(429, "this rollout made its allowed number of LLM calls", "turn_limit")
        if lease.in_flight >= self._settings.relay_max_calls_per_token:
            cap = self._settings.relay_max_calls_per_token
            return error_response(429, f"this rollout has {cap} LLM calls in flight already", "concurrency_limit")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body over {self._settings.relay_max_body_bytes} bytes", "too_large")
        if not lease.usable():  # revoked while the body was uploading: nothing goes upstream
            return error_response(401, "invalid, expired or revoked relay token", "authentication_error")
        body = parse_json_object(raw)
        if body is None:
            return error_response(400, "request body is not a JSON object", "invalid_request_error")
        assert self._session is not None
        task = asyncio.current_task()
        assert task is not None
        lease.track(task)
        try:
            return await relay_call(request, lease, route, body, self._session, self._settings)
        finally:
            lease.untrack(task)


def _models(lease: Lease) -> web.Response:
    model = lease.upstream.model
    data = [] if model is None else [{"id": model, "object": "model", "created": 0, "owned_by": "coding-agent-env"}]
    return web.Response(text=json.dumps({"object": "list", "data": data}), content_type="application/json")


def _prepare_socket_dir(directory: Path) -> None:
    """Create the socket directory (0711 up the chain) and remove sockets left by dead server processes."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in (directory.parent, directory):
        os.chmod(path, 0o711)
    for stale in directory.glob("*.sock"):
        pid = stale.name.split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            log.warning("removing relay socket of dead process %s", pid)
            stale.unlink(missing_ok=True)


