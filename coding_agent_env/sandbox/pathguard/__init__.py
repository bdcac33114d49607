"""The path guard hardened verify puts on PYTHONPATH (`sitecustomize.py` here: read it for what it does), and
where a backend makes its directory.

Contract: `files()` is the directory's content, by name (one file, `sitecustomize.py`); `install(state_dir)`
makes `state_dir/pathguard/<digest>/` holding it (directory 0755, file 0644, owned by this process's user),
once per content (an existing one is reused; made under a temporary name and renamed, so concurrent callers
never see half of it), and returns it. A backend shows that directory to its sandboxes READ-ONLY to every
process there (a read-only bind, a directory owned by a user none of its processes runs as) and names it in
`Sandbox.path_guard`; a backend that cannot says None, and verify keeps Python's safe path alone.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from pathlib import Path

__all__ = ["HOOK", "STATE_SUBDIR", "files", "install"]

HOOK = "sitecustomize.py"
STATE_SUBDIR = "pathguard"
"""The server's directory of guards under its state dir (one per content, kept: the next server reuses it)."""
_SOURCE = Path(__file__).with_name(HOOK)
_DIR_MODE = 0o755
_FILE_MODE = 0o644


@functools.cache
def _source() -> tuple[bytes, str]:
    """The hook's source and its digest, read once per process (the installed package does not change under a
    running server)."""
    source = _SOURCE.read_bytes()
    return source, hashlib.sha256(source).hexdigest()[:16]


def files() -> dict[str, bytes]:
    """The guard directory's files, by name."""
    return {HOOK: _source()[0]}


def install(state_dir: Path) -> Path:
    """`state_dir/pathguard/<digest>` with the hook in it (see the module docstring); OSError if it cannot be
    made. Blocking: call it off the event loop."""
    source, digest = _source()
    parent = state_dir / STATE_SUBDIR
    target = parent / digest
    if (target / HOOK).is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    os.chmod(parent, _DIR_MODE)  # traversable by sandbox uids, whatever the umask
    partial = parent / f".{digest}.{os.getpid()}-{secrets.token_hex(4)}"
    partial.mkdir(mode=_DIR_MODE)
    try:
        (partial / HOOK).write_bytes(source)
        os.chmod(partial / HOOK, _FILE_MODE)
        os.chmod(partial, _DIR_MODE)  # whatever the umask
        try:
            os.rename(partial, target)
        except OSError:
            if not (target / HOOK).is_file():  # not a concurrent caller's: a real failure
                raise
    finally:
        if partial.exists():
            (partial / HOOK).unlink(missing_ok=True)
            partial.rmdir()
    return target
