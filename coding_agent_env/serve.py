"""`coding-agent-env serve [ENV_DIR] [--host H] [--port P] [--reload] [--tasks SOURCE...]`: what `openenv serve` was
meant to be.

Without ENV_DIR it serves this package's app (`build_app(Settings.from_env())`). With ENV_DIR it serves any
OpenEnv environment directory from its `openenv.yaml`: `app` (`module:attr`, imported with ENV_DIR as the
app dir, so uvicorn's reloader subprocess can import it too), `port`, `runtime` (must be `fastapi`).

Port: `--port`, else the manifest's `port` (or the PORT setting without ENV_DIR), else 8000. Host: 127.0.0.1
unless `--host` is given; all interfaces is allowed but warned about. Every invalid input raises
`ServeError` with a one-line message (the CLI prints it, exit 2). This module never changes the caller's
cwd or `sys.path`; uvicorn receives the app dir instead. `--tasks` (this package's app only) is the `TASKS`
setting: `serve` puts it in its own environment just before serving, so the app factory (and a reloader's
subprocess) reads it as every other setting; each source must exist.

Operator secrets (`settings.secrets`): serving this package's app, `serve` first re-executes itself without them
in its environment, handing them over through an inherited memfd (`hide_secrets`), so neither
`/proc/<server pid>/environ` nor any child the server starts holds them; `uvicorn server.app:app` does the same
from `server/app.py`. `--reload` cannot (its workers are fresh interpreters reading their settings from the
environment): it keeps them there and says so.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.settings import Settings
from coding_agent_env.settings.secrets import reexec_without_secrets, secrets_in

__all__ = ["DEFAULT_PORT", "LaunchPlan", "ServeError", "add_arguments", "main", "plan", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
OWN_APP_FACTORY = "coding_agent_env.serve:create_app"
_ALL_INTERFACES = ("0.0.0.0", "::", "[::]")
_APP_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

Runner = Callable[..., Any]


class ServeError(CodingAgentEnvError):
    """`serve` was given something it cannot serve; the message is one line."""


@dataclass(frozen=True)
class LaunchPlan:
    """Exactly what is handed to uvicorn."""

    app: str
    host: str
    port: int
    reload: bool
    factory: bool = False
    app_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    """Settings the flags set, put in the server's environment before it starts (`--tasks`: TASKS)."""

    def uvicorn_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "reload": self.reload, "factory": self.factory}
        if self.app_dir is not None:
            kwargs["app_dir"] = self.app_dir
            if self.reload:
                kwargs["reload_dirs"] = [self.app_dir]
        return {**kwargs, **self.extra}


def create_app() -> Any:
    """The factory uvicorn imports (also in its reloader subprocess) to serve this package's app."""
    from coding_agent_env.api import build_app  # the api layer is imported only when serving

    return build_app(Settings.from_env())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_dir", nargs="?", help="an OpenEnv environment directory (with openenv.yaml)")
    parser.add_argument("--host", help=f"interface to bind (default {DEFAULT_HOST}; 0.0.0.0 = all, explicitly)")
    parser.add_argument("--port", help=f"port (default: the manifest's, else {DEFAULT_PORT})")
    parser.add_argument("--reload", action="store_true", help="restart when source files change")
    parser.add_argument("--tasks", nargs="+", metavar="SOURCE",
                        help="serve a task set (Task API, reset(split=, index=)): Harbor task directories, a directory "
                             "of split directories, JSONL or request files; SPLIT=PATH names the split")


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ServeError(f"{where} must be an integer in 1-65535, got {value!r}")
    try:
        port = int(value)
    except ValueError:
        raise ServeError(f"{where} must be an integer in 1-65535, got {value!r}") from None
    if not 1 <= port <= 65535:
        raise ServeError(f"{where} must be an integer in 1-65535, got {value!r}")
    return port


def _tasks_environ(sources: list[str] | None) -> dict[str, str]:
    if not sources:
        return {}
    for source in sources:
        if "," in source:
            raise ServeError(f"--tasks {source}: a path with a comma cannot be served (TASKS is comma-separated)")
        name, sep, rest = source.partition("=")
        path = Path(rest if sep and not Path(source).exists() else source)
        if not path.exists():
            raise ServeError(f"--tasks {source}: no such file or directory")
    return {"TASKS": ",".join(sources)}


def read_manifest(env_dir: Path) -> dict[str, Any]:
    """The directory's `openenv.yaml` as a mapping, or ServeError."""
    if not env_dir.is_dir():
        raise ServeError(f"{env_dir}: no such directory")
    manifest = env_dir / "openenv.yaml"
    if not manifest.is_file():
        raise ServeError(f"{env_dir}: no openenv.yaml (not an OpenEnv environment directory)")
    try:
        data = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ServeError(f"{manifest}: invalid YAML: {first}") from None
    if not isinstance(data, dict):
        raise ServeError(f"{manifest}: must be a mapping of keys (name, app, port, runtime)")
    return data


def plan(args: argparse.Namespace, settings: Settings | None = None) -> LaunchPlan:
    """Work out what to serve from the arguments (and the manifest); ServeError on invalid input."""
    host = args.host or DEFAULT_HOST
    if args.env_dir is None:
        settings = settings or Settings.from_env()
        port = _port(args.port, "--port") if args.port is not None else settings.port
        extra = {
            "ws": "websockets-sansio",
            "ws_max_size": settings.ws_max_message_bytes,
            "ws_per_message_deflate": settings.ws_compression,
        }
        return LaunchPlan(app=OWN_APP_FACTORY, host=host, port=port, reload=args.reload, factory=True, extra=extra,
                          environ=_tasks_environ(getattr(args, "tasks", None)))
    if getattr(args, "tasks", None):
        raise ServeError("--tasks serves this package's task set; an OpenEnv environment directory has its own")
    env_dir = Path(args.env_dir).resolve()
    manifest = read_manifest(env_dir)
    runtime = manifest.get("runtime", "fastapi")
    if runtime != "fastapi":
        raise ServeError(f"{env_dir / 'openenv.yaml'}: runtime {runtime!r} is not supported (only 'fastapi')")
    app = manifest.get("app")
    if not isinstance(app, str) or not _APP_REF.match(app):
        raise ServeError(f"{env_dir / 'openenv.yaml'}: 'app' must be 'module:attribute', got {app!r}")
    if args.port is not None:
        port = _port(args.port, "--port")
    elif "port" in manifest:
        port = _port(manifest["port"], f"{env_dir / 'openenv.yaml'}: 'port'")
    else:
        port = DEFAULT_PORT
    return LaunchPlan(app=app, host=host, port=port, reload=args.reload, app_dir=str(env_dir))


SERVER_EXTRA_MISSING = "the server's dependencies are not installed: pip install 'coding-agent-env[server]'"


def serve(args: argparse.Namespace, runner: Runner | None = None) -> int:
    """Plan, warn about all-interface binds, and hand the plan to `runner` (uvicorn.run)."""
    if runner is None and args.env_dir is None:
        hide_secrets(reload=args.reload)
    launch = plan(args)
    if launch.host in _ALL_INTERFACES:
        print(f"coding-agent-env: warning: binding all interfaces ({launch.host}); the server is reachable "
              "from other machines", file=sys.stderr)
        if args.env_dir is None and Settings.from_env().api_token is None:
            print("coding-agent-env: warning: no API_TOKEN is set: whoever reaches the server can run commands "
                  "on it (docs/security.md)", file=sys.stderr)
    if runner is None:
        runner = server_runner()
    os.environ.update(launch.environ)
    runner(launch.app, **launch.uvicorn_kwargs())
    return 0


def hide_secrets(*, reload: bool = False) -> None:
    """Re-execute this process without the operator secrets in its environment (`settings.secrets`); with
    `reload`, warn instead that they stay there. Returns only when there is nothing (more) to do."""
    if not reload:
        reexec_without_secrets()
    elif secrets_in(os.environ):
        print("coding-agent-env: warning: with --reload the operator secrets stay in the server's environment "
              f"({', '.join(secrets_in(os.environ))}), where its children can read them; never expose such a "
              "server", file=sys.stderr)


def launched_by_uvicorn() -> bool:
    """Whether this process is uvicorn's own command (`uvicorn ...`, `python -m uvicorn ...`) serving in this
    process (not a worker or reloader child, which cannot be re-executed)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    own = script.name == "uvicorn" or script.parts[-2:] == ("uvicorn", "__main__.py")
    return own and multiprocessing.parent_process() is None


def server_runner() -> Runner:
    """uvicorn's `run`; `CodingAgentEnvError` naming the extra when the server's dependencies are not installed."""
    try:
        import uvicorn
    except ImportError:
        raise CodingAgentEnvError(SERVER_EXTRA_MISSING) from None
    return uvicorn.run


def main(argv: list[str] | None = None) -> int:
    """`python -m coding_agent_env.serve`-style entry: parse, serve, one-line errors (exit 2)."""
    parser = argparse.ArgumentParser(prog="coding-agent-env serve")
    add_arguments(parser)
    try:
        return serve(parser.parse_args(argv))
    except ServeError as exc:
        print(f"coding-agent-env: {exc}", file=sys.stderr)
        return 2
