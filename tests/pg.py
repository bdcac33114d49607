"""A throwaway PostgreSQL server for tests: `initdb` into a temp dir, listening on a unix socket only (no TCP),
password (SCRAM) authentication, so the URLs tests use carry a real password that must never leak.

PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` system user (Debian's
package makes it) and its commands run through `runuser`; otherwise as the current user. The password reaches
`initdb` through a 0600 file, never argv. `stop` is `pg_ctl stop` (the postmaster by its pid file), then the
directory goes.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Self

__all__ = ["PostgresServer", "postgres_bin"]

_USER = "cae"
"""The cluster's superuser (the role the tests' URLs name)."""
_START_DEADLINE_S = 60


def postgres_bin() -> Path | None:
    """The directory of `initdb` and `pg_ctl`: `PG_BIN`, else the newest Debian `/usr/lib/postgresql/*/bin`, else
    PATH; None when PostgreSQL is not installed."""
    candidates = [os.environ["PG_BIN"]] if os.environ.get("PG_BIN") else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    found = shutil.which("initdb")
    candidates += [str(Path(found).parent)] if found else []
    return next((Path(c) for c in candidates if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists()),
                None)


class PostgresServer:
    """One cluster; `with PostgresServer(bin_dir) as server: server.create_database(name) ...`."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.password = secrets.token_urlsafe(18)
        # A short path of its own (not pytest's 0700 tmp tree): the socket path has a ~100-byte limit, and the
        # `postgres` user must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="cae-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._started = False

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if self._owner else []
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=_START_DEADLINE_S,
                              check=False, cwd=self.root)

    def _check(self, what: str, done: subprocess.CompletedProcess[str]) -> None:
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{what} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}{log}")

    def start(self) -> PostgresServer:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if self._owner:
            for path in (self.root, pwfile):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
        self._check("initdb", self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", _USER,
                                        "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"))
        pwfile.unlink()
        options = f"-k {self.root} -c listen_addresses='' -c fsync=off -c max_connections=60"
        self._started = True  # from here on, stop() has a cluster to stop even if start fails half-way
        self._check("pg_ctl start", self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                                              "-w", "-t", str(_START_DEADLINE_S), "-o", options, "start"))
        return self

    def url(self, database: str = "postgres") -> str:
        """A libpq URL to `database` over the unix socket, with the password."""
        return f"postgresql://{_USER}:{self.password}@/{database}?host={self.root}"

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser, outside a transaction (CREATE / DROP DATABASE)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new empty database; its URL."""
        name = f"t_{secrets.token_hex(6)}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.split("@/", 1)[1].split("?", 1)[0]
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        try:
            if self._started:
                self._check("pg_ctl stop", self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                                                     "-w", "stop"))
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
