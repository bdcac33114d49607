"""The local backend: each command in its own bubblewrap sandbox over a per-rollout host directory.

A sandbox is a host directory `STATE_DIR/<server pid>-<rollout>-<random>/` with `work`, `home`, `tmp` and
`logs`, bound inside bubblewrap at `/workspace`, `/home/sandbox`, `/tmp` and `/logs`. Every `exec`/`spawn`
is a fresh `bwrap --unshare-all --die-with-parent --new-session` (no network, own PID namespace, all
capabilities dropped, uid 1000 inside) over read-only system directories, with rlimits set inside by
`prlimit` (as root: on bwrap itself, by the launcher below). Killing a command's bwrap kills its whole PID
namespace, so no descendant survives.

When the server runs as root, each sandbox also gets its own host uid from a pool, unique on the whole host
(each uid held by a lock file while its sandbox lives, whatever number of servers and CLIs run: `uids`): its
processes are not root anywhere, the process limit is really enforced (root is exempt from RLIMIT_NPROC), and sandboxes
cannot read one another's files. bwrap is then started through a tiny compiled helper (`enter`; where no C
compiler is there, `nsenter` and `prlimit` do the same in two execs), which switches to that uid and
joins a network namespace made once per sandbox (empty but for loopback; see `netns`), so a command costs
no namespace of its own to create and destroy. Commands of one sandbox can thus reach one another over
loopback while they run, as they can through its files; nothing in the namespace outlives its processes.

With network policy `llm`, a spawned agent reaches the relay at `relay_url`
(`http://127.0.0.1:SANDBOX_RELAY_PORT/v1`) and nothing else; setup and verify never do. As root the relay
serves that port itself (`RelayEndpoint.serve`: no process inside, no extra hop) on a socket in the sandbox's
namespace, bound at create() and listening only from the spawn until the agent exits, when it is closed; a
spawn while another runs gets a namespace of its own for it. Without root, each spawn gets its namespace from
bwrap, and a small forwarder started inside pipes the port to the relay's unix socket, bind-mounted at
/run/llm.sock.

Sandbox-wide limits (`SandboxLimits`): as root, each sandbox gets a control group of its own (memory, processes,
CPU; see `cgroup`), which every command joins before it starts, and its root is a tmpfs of its disk budget
(`disk`); close() kills the group, so nothing it started survives. Without root, the process limit counts the
sandbox's own (its user namespace), memory and CPU are per-process rlimits only, and the disk budget is
watched (the sandbox's commands are killed once it is passed); `limits` and `limit_scopes` say which.

The task's layout (`SandboxSpec.workdir`, `writable_roots`, `tests`) and users (`users`, `exec(user=...)`) are
honoured under bubblewrap (`layout`): the workspace bound at the task's workdir, each further root a directory
of the sandbox root bound at its path, `/tests` only when asked; as root, a sandbox with users runs in a user
namespace of its own mapping inner 0..65535 onto a host id range of its own (`SANDBOX_UID_RANGE_BASE`,
`SANDBOX_UID_RANGE_COUNT`; its inner 1000 stays its uid), made at create, which every command joins as the
user asked (root with namespace-only capabilities). What a mode cannot show is refused at create
(`SandboxUnsupportedError` naming the setting): any of them unisolated, users without root.

Where bubblewrap cannot create namespaces (e.g. in an unprivileged container), or where the operator chose
`LocalConfig.isolation="landlock"`, commands run in the host directory, each confined by Landlock and seccomp
(`landlocked`; `isolation` says `landlock`); where neither works, or where the operator chose
`LocalConfig.isolation="none"`, as plain subprocesses there, and `isolation` says `none`. Which of these modes
runs is probed once (`probe`) and is then one `Launch` strategy (`launch`).
"""


from __future__ import annotations

import asyncio
import functools
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from coding_agent_env.aio import shielded
from coding_agent_env.settings.backends import LocalConfig
from coding_agent_env.errors import SandboxError, SandboxUnavailableError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import (
    BackendStatus,
    Sandbox,
    SandboxBackend,
    SandboxLimits,
    SandboxSpec,
    SandboxTemplate,
    scopes,
)
from coding_agent_env.sandbox import pathguard
from coding_agent_env.sandbox.local.cgroup import Cgroups
from coding_agent_env.sandbox.local.disk import mount_tmpfs, unmount
from coding_agent_env.sandbox.local.fork import LocalTemplate, overlay_refusal, used_bytes
from coding_agent_env.sandbox.local.launch import ROOT_SUBDIRS, SHM_SUBDIR, SUBDIRS, Launch, Unisolated
from coding_agent_env.sandbox.local.layout import RANGE_SIZE, LocalLayout, make_userns
from coding_agent_env.sandbox.local.probe import probe
from coding_agent_env.sandbox.local.refusal import no_tier_refusal
from coding_agent_env.sandbox.local.provision import Bounds, DirWork, Provisioner, reap
from coding_agent_env.sandbox.local.reach import unreachable_state_dir
from coding_agent_env.sandbox.local.sandbox import LocalSandbox
from coding_agent_env.sandbox.local.uids import UidPool
from coding_agent_env.settings import Settings

__all__ = ["LocalBackend"]

log = logging.getLogger(__name__)


class LocalBackend(SandboxBackend):
    """Makes `LocalSandbox`es. Probes the host once, on first use; `dirs` says where directory work runs."""

    name = "local"

    def __init__(self, config: LocalConfig, settings: Settings, *, dirs: DirWork | None = None) -> None:
        self._config = config
        self._settings = settings
        self._launch: Launch | None = None
        self._probe_lock = threading.Lock()
        self._as_root = os.geteuid() == 0
        self._reaped = False
        self._uids = UidPool(config.uid_base, config.uid_count) if self._as_root else None
        self._ranges = (
            UidPool(config.uid_range_base, config.uid_range_count, step=RANGE_SIZE, prefix="range-")
            if self._as_root else None
        )
        self._bounds = Bounds()
        self._dirs = dirs or DirWork()
        self._guard: Path | None = None
        """The path guard's host directory, made at the first create (`pathguard.install`)."""
        self._unreachable: str | None = None
        """Why the sandboxes' uids cannot reach STATE_DIR (`reach`), found at the probe; None: they can."""

    def _probe(self) -> Launch:
        with self._probe_lock:
            if self._launch is None:
                self._bounds = (_discover_bounds(self._settings.state_dir, self._config.cpu_weight)
                                if self._as_root else Bounds())
                self._unreachable = self._reach() if self._as_root else None
                self._launch = probe(self._config, self._settings, as_root=self._as_root)
                log.info("local sandbox isolation: %s; %s", self._launch.detail, self._bounds_detail())
            return self._launch

    def _reach(self) -> str | None:
        """As root: whether a sandbox uid (one taken from the pool for the question) reaches STATE_DIR."""
        assert self._uids is not None
        try:
            uid = self._uids.take()
        except SandboxError as exc:  # every uid busy (other servers' sandboxes): they reach it, evidently
            log.info("STATE_DIR reach not checked: %s", exc)
            return None
        try:
            return unreachable_state_dir(self._settings.state_dir, uid)
        except OSError as exc:
            return f"STATE_DIR {self._settings.state_dir} cannot be made: {exc.strerror}"
        finally:
            self._uids.give(uid)

    def _bounds_detail(self) -> str:
        bounds = self._bounds
        group = bounds.cgroups.detail if bounds.cgroups is not None else "no control group (per-process rlimits)"
        disk = "a tmpfs root of the disk budget" if bounds.tmpfs else "a watched disk budget"
        return f"sandbox-wide limits: {group}, {disk}"

    def _limits(self, launch: Launch, limits: SandboxLimits, own_uid: bool) -> tuple[dict[str, int], dict[str, int]]:
        """(the rlimits every command gets, all limits enforced by name)."""
        # With a control group its pids limit bounds the whole sandbox; RLIMIT_NPROC, hit first, would hide that.
        process = limits.rlimits(nproc=launch.nproc_counts(own_uid) and self._bounds.cgroups is None)
        wide: dict[str, int] = {"disk": limits.disk_mb << 20}
        if self._bounds.cgroups is not None:
            wide.update(memory=self._bounds.cgroup_limits(limits).memory_bytes, pids=limits.max_processes)
            if limits.cpus > 0:
                wide["nano_cpus"] = round(limits.cpus * 1e9)
        return process, {**process, **wide}

    def _scopes(self, enforced: dict[str, int]) -> dict[str, str]:
        return scopes(enforced, **({} if self._bounds.tmpfs else {"disk": "watched"}))

    def _refusal(self, launch: Launch) -> str | None:
        """Why no sandbox can be made here under this config (isolation required but unavailable, or STATE_DIR
        out of the sandboxes' reach), or None."""
        config = self._config
        if self._unreachable is not None:
            return self._unreachable
        if config.isolation == "bwrap" and launch.isolation != "bwrap":
            return f"bubblewrap is required (LOCAL_ISOLATION=bwrap): {launch.detail}"
        if config.isolation == "landlock" and launch.isolation != "landlock":
            return f"Landlock is required (LOCAL_ISOLATION=landlock): {launch.detail}"
        if config.isolation == "auto" and launch.isolation == "none" and not config.allow_unisolated:
            return no_tier_refusal(launch.detail)
        return self._secrets_refusal(launch)

    def _secrets_refusal(self, launch: Launch) -> str | None:
        """Why unisolated commands are refused here while the server holds operator secrets, or None."""
        held = self._settings.configured_secrets
        if launch.isolation != "none" or not held or self._config.allow_unisolated_with_secrets:
            return None
        return (
            f"commands would run unisolated ({launch.detail}) while this server holds operator secrets "
            f"({', '.join(held)}), which any such command could read. "
            "Use a backend that isolates (bubblewrap, Landlock, docker, a remote sandbox), remove the secrets, or "
            "set SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS=true to run callers' commands where they can read them"
        )

    async def refusal(self) -> str | None:
        launch = self._launch or await asyncio.to_thread(self._probe)
        return self._refusal(launch)

    def check(self) -> BackendStatus:
        launch = self._probe()
        refusal = self._refusal(launch)
        if refusal is not None:
            return BackendStatus(self.name, False, None, refusal)
        _, limits = self._limits(launch, SandboxLimits.from_settings(self._settings), self._as_root)
        detail = f"{launch.detail}; {self._bounds_detail()}"
        return BackendStatus(self.name, True, launch.isolation, detail, limits, self._scopes(limits))

    async def create(self, spec: SandboxSpec) -> Sandbox:
        return await self._create(spec, None)

    def fork_refusal(self, spec: SandboxSpec) -> str | None:
        launch = self._launch or self._probe()
        if not self._as_root or not self._bounds.tmpfs or self._bounds.cgroups is None:
            return ("forking needs a server running as root, with a tmpfs root and a control group per sandbox "
                    "(overlay mounts over the template; each member's own pids limit)")
        if launch.isolation != "bwrap":
            return f"forking needs bubblewrap ({launch.detail})"
        if spec.users:
            return "a sandbox with users has a host id range of its own, which forks of it cannot share"
        return overlay_refusal(self._settings.state_dir)

    async def snapshot(self, sandbox: Sandbox) -> SandboxTemplate:
        if not isinstance(sandbox, LocalSandbox) or sandbox.host_uid is None:
            await sandbox.close()
            raise SandboxUnsupportedError("local", "group", "only a local sandbox made as root can be frozen")
        uid = sandbox.host_uid
        template = LocalTemplate(sandbox.root, uid, sandbox.subdirs, functools.partial(self._release, uid))
        try:
            await shielded(sandbox.freeze())
            # In the try: cancelled while measured (a worker thread), the template nobody will hold is released.
            template.size = await asyncio.to_thread(used_bytes, template.root)
        except BaseException:
            await shielded(template.release())
            raise
        return template

    async def fork(self, spec: SandboxSpec, template: SandboxTemplate) -> Sandbox:
        refusal = self.fork_refusal(spec)
        if refusal is not None:
            raise SandboxUnsupportedError("local", "group", refusal)
        if not isinstance(template, LocalTemplate) or template.released:
            raise SandboxError(f"group template {template.id} is released or not this backend's")
        return await self._create(spec, template)

    async def _create(self, spec: SandboxSpec, base: LocalTemplate | None) -> Sandbox:
        """A new sandbox of `spec`; with `base`, forked from that template (its uid, its directories below)."""
        launch = self._launch or await asyncio.to_thread(self._probe)
        refusal = self._refusal(launch)
        if refusal is not None:
            raise SandboxUnavailableError(refusal)
        if not self._reaped:
            self._reaped = True
            reaped = await self.reap_orphans()
            if reaped:
                log.warning("removed %d sandbox directories left by a crashed server", reaped)
        if spec.network == "host":
            raise SandboxUnavailableError("network policy 'host' is not available on the local backend")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs the relay's endpoint")
        relay = spec.relay if spec.network == "llm" else None
        layout = LocalLayout.of(spec, isolated=not isinstance(launch, Unisolated))  # Landlocked is one too
        if layout.users and not (self._as_root and launch.supports_users):
            raise SandboxUnsupportedError("local", "users", "other users need a server running as root (a range of "
                                                            "host ids for the sandbox's own user namespace)")
        if layout.users:
            unable = await asyncio.to_thread(launch.users_refusal)
            if unable is not None:
                raise SandboxUnsupportedError("local", "users", unable)
        guard = self._guard or await asyncio.to_thread(self._install_guard)
        # The relay port in the sandbox's namespace is reserved now, for the agent (see `relay`).
        port = self._config.relay_port
        reserve = port if relay is not None and relay.serve is not None else None
        subdirs = (*ROOT_SUBDIRS, *layout.subdirs)
        if base is not None:
            if subdirs != base.subdirs:
                raise SandboxUnsupportedError("local", "group", "the member's layout is not its template's")
            uid: int | None = base.uid
            base.fork_started()
            give_back: Callable[[int | None], None] = base.fork_gone  # the uid is the template's
        else:
            uid = self._uids.take() if self._uids is not None else None
            give_back = self._release
        limits = spec.limits or SandboxLimits.from_settings(self._settings)
        shared = {SUBDIRS["tmp"]: 0o1777, SHM_SUBDIR: 0o1777} if layout.users else None
        provisioner = Provisioner(
            self._settings.state_dir, self._dirs, with_netns=launch.own_netns, bounds=self._bounds, limits=limits,
            subdirs=subdirs, modes=shared, base=base,
        )
        users = await self._users(uid) if layout.users else None
        userns, release_users = users if users is not None else (None, None)

        def release() -> None:
            give_back(uid)
            if users is not None:
                os.close(users[0])
                users[1]()

        made = await provisioner.make(spec.rollout_id, uid, reserve, release=release)
        self._dirs.live += 1  # on the loop, as is every change of it
        process, enforced = self._limits(launch, limits, uid is not None)
        box = LocalSandbox(
            launch, made, uid,
            limits=process, enforced=enforced, scopes=self._scopes(enforced), disk_budget=limits.disk_mb << 20,
            relay=relay, relay_port=port, agents_source=spec.agents_dir, release=give_back, dirs=self._dirs,
            layout=layout, userns=userns, release_users=release_users, guard_source=guard,
        )
        box.task_env = MappingProxyType(dict(spec.env))  # no image here: the task's variables alone
        return box

    def _install_guard(self) -> Path:
        """The path guard's directory under the state dir (as the relay's forwarder is: traversable by sandbox
        uids); `SandboxError` if it cannot be made (no sandbox could be, there)."""
        try:
            self._guard = pathguard.install(self._settings.state_dir)
        except OSError as exc:
            raise SandboxError(f"cannot make the path guard under {self._settings.state_dir}: {exc}") from exc
        return self._guard

    async def _users(self, uid: int | None) -> tuple[int, Callable[[], None]]:
        """A sandbox with users: its id range, taken, and its user namespace (our descriptor), made; and what
        gives the range back. On failure the uid and the range are given back."""
        assert uid is not None and self._ranges is not None
        ranges = self._ranges
        try:
            base = ranges.take()
        except BaseException:
            self._release(uid)
            raise
        made = asyncio.ensure_future(asyncio.to_thread(make_userns, uid, base))
        try:
            fd = await asyncio.shield(made)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.wait([made])
                if not made.cancelled() and made.exception() is None:
                    os.close(made.result())
            self._release(uid)
            ranges.give(base)
            if isinstance(exc, SandboxError):
                raise SandboxUnsupportedError("local", "users", str(exc)) from exc
            raise
        return fd, lambda: ranges.give(base)

    def _release(self, uid: int | None) -> None:
        if uid is not None and self._uids is not None:
            self._uids.give(uid)

    async def reap_orphans(self) -> int:
        """Remove sandbox directories (and control groups) whose server process is gone."""
        if self._launch is None:
            await asyncio.to_thread(self._probe)  # where this server's control groups are is found there
        groups = self._bounds.cgroups
        if groups is not None:
            await asyncio.to_thread(groups.reap)
        return await asyncio.to_thread(reap, self._settings.state_dir)


def _discover_bounds(state_dir: Path, cpu_weight: int) -> Bounds:
    """As root: the control groups this server may make (each of `cpu_weight`), and whether it may mount a tmpfs
    (tried once)."""
    cgroups = Cgroups.discover()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tmpfs-probe-", dir=state_dir) as trial:
            mount_tmpfs(Path(trial), 1 << 20, None)
            tmpfs = unmount(Path(trial))
    except OSError as exc:
        log.warning("no tmpfs per sandbox here (%s): disk budgets are watched, not enforced by the kernel", exc)
        tmpfs = False
    return Bounds(cgroups, tmpfs, cpu_weight)
