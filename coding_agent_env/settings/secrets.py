"""Operator secrets: read once, then out of the server's process environment.

`os.environ` edits do not change what the kernel shows as a process's environment (`/proc/PID/environ` is the
exec-time block), and every child started without an explicit environment inherits it. So a server that finds
secrets in its environment re-executes itself without them (`reexec_without_secrets`): the values are written to
a memfd, handed over as an inherited file descriptor whose number alone is in the new environment
(`SECRETS_FD_VARIABLE`), and the new process image reads and closes it on first use (`handed_over`), keeping
them only in memory. Never in argv, never in a file on disk.

`HF_TOKEN` is also read by `huggingface_hub` (the `hf` backend's HF Jobs), which looks only at the environment
and at a token file: it gets a memfd of its own holding the token, named by `HF_TOKEN_PATH=/proc/self/fd/N` (a
path, no secret; unless the operator set one), kept open but not inherited by children.

Which variables are secrets is told by `Settings` itself: every field typed `SecretStr` (any `*_API_KEY`,
`HF_TOKEN`, `API_TOKEN`, `METRICS_TOKEN`, `RESULTS_DB`), the backends' secret fields (`E2B_API_KEY`,
`HF_SANDBOX_TOKEN`) and `LLM_ENDPOINTS` (its entries carry keys): `secret_variables()`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from pydantic import SecretStr

from coding_agent_env.errors import SettingsError

__all__ = [
    "SECRETS_FD_VARIABLE",
    "handed_over",
    "reexec_without_secrets",
    "secret_variables",
    "secrets_in",
]

SECRETS_FD_VARIABLE = "CODING_AGENT_ENV_SECRETS_FD"
"""The environment variable holding the number of the inherited descriptor the secrets are read from."""

_EXTRA_SECRET_VARIABLES = ("LLM_ENDPOINTS",)
"""Variables that are not `SecretStr` fields but carry secrets (each endpoint's `api_key`)."""

_MAX_HANDOVER_BYTES = 16 * 1024 * 1024
HUB_TOKEN_VARIABLE = "HF_TOKEN"
HUB_TOKEN_PATH_VARIABLE = "HF_TOKEN_PATH"
"""huggingface_hub's token file setting: where it reads the token when `HF_TOKEN` is not in the environment."""
_HUB_TOKEN_FD_VARIABLE = "CODING_AGENT_ENV_HF_TOKEN_FD"

_lock = threading.Lock()
_held: dict[str, str] | None = None


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in getattr(annotation, "__args__", ())


def secret_variables() -> tuple[str, ...]:
    """The environment variables the settings read that hold operator secrets."""
    from coding_agent_env.settings import Settings  # the fields are the truth
    from coding_agent_env.settings.backends import BACKEND_KINDS

    names = [name.upper() for name, field in Settings.model_fields.items() if _is_secret(field.annotation)]
    for model in BACKEND_KINDS.values():
        names += [var for name, var in model.ENV.items() if _is_secret(model.model_fields[name].annotation)]
    return tuple(dict.fromkeys([*names, *_EXTRA_SECRET_VARIABLES]))


def secrets_in(environ: Mapping[str, str]) -> dict[str, str]:
    """The secret variables set in `environ`, by name."""
    return {name: environ[name] for name in secret_variables() if name in environ}


def handed_over() -> Mapping[str, str]:
    """The secrets a previous image of this process handed over (read from the descriptor, which is then closed,
    once); empty when nothing was handed over. `SettingsError` when the descriptor cannot be read."""
    global _held
    with _lock:
        if _held is None:
            _held = _receive(os.environ.pop(SECRETS_FD_VARIABLE, None))
            _keep_private(os.environ.pop(_HUB_TOKEN_FD_VARIABLE, None))
        return dict(_held)


def _keep_private(number: str | None) -> None:
    """The hub token's memfd stays open for this process (huggingface_hub reads it by path), never inherited."""
    if number is not None:
        try:
            os.set_inheritable(int(number), False)
        except (ValueError, OSError) as exc:
            raise SettingsError(f"{_HUB_TOKEN_FD_VARIABLE}: not an open descriptor ({type(exc).__name__})") from None


def _receive(number: str | None) -> dict[str, str]:
    if number is None:
        return {}
    try:
        fd = int(number)
        with os.fdopen(fd, "rb", closefd=True) as handover:
            handover.seek(0)
            data = json.loads(handover.read(_MAX_HANDOVER_BYTES))
    except (ValueError, OSError) as exc:
        raise SettingsError(f"{SECRETS_FD_VARIABLE}: the secrets handed over cannot be read "
                            f"({type(exc).__name__})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise SettingsError(f"{SECRETS_FD_VARIABLE}: the secrets handed over are not a mapping of strings")
    return data


def reexec_without_secrets(argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None) -> None:
    """Re-execute this process (`sys.executable` with `argv`, default `sys.orig_argv`) without the secret
    variables in its environment, handing their values over through a memfd; returns only when there is nothing
    to hide (in a process re-executed so, secrets set again after the exec are taken out of `os.environ` and held
    with the others: at most one exec). Call it before the process starts threads, binds sockets or starts
    children."""
    env = dict(os.environ if environ is None else environ)
    found = secrets_in(env)
    if not found:
        return
    if SECRETS_FD_VARIABLE in env:
        # Re-executed already, and the secrets are back: this process's own start-up put them in `os.environ`
        # after the exec (a launcher's env file, uvicorn's --env-file), so they are not in its exec-time
        # environment; taken out of `os.environ`, never re-executed again (that would loop forever).
        _adopt(found)
        return
    _exec_handing_over(found, [name for name in env if name not in found], env, argv)


def _adopt(found: Mapping[str, str]) -> None:
    """Hold `found` with what was handed over (theirs win: the newer word) and take them out of `os.environ`."""
    global _held
    handed_over()
    with _lock:
        _held = {**(_held or {}), **found}
    for name in found:
        os.environ.pop(name, None)


def _exec_handing_over(found: Mapping[str, str], keep: Iterable[str], env: Mapping[str, str],
                       argv: Sequence[str] | None) -> NoReturn:
    clean = {name: env[name] for name in keep}
    fds = [_inheritable_memfd("coding-agent-env-secrets", json.dumps({**handed_over(), **found}))]
    try:
        clean[SECRETS_FD_VARIABLE] = str(fds[0])
        if HUB_TOKEN_VARIABLE in found and HUB_TOKEN_PATH_VARIABLE not in env:
            fds.append(_inheritable_memfd("coding-agent-env-hf-token", found[HUB_TOKEN_VARIABLE]))
            clean[_HUB_TOKEN_FD_VARIABLE] = str(fds[1])
            clean[HUB_TOKEN_PATH_VARIABLE] = f"/proc/self/fd/{fds[1]}"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, list(argv if argv is not None else sys.orig_argv), clean)
    finally:  # only when exec failed
        for fd in fds:
            os.close(fd)


def _inheritable_memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name)  # close-on-exec until made inheritable below
    try:
        data = text.encode()
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
