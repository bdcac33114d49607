"""The root Dockerfile's image, built as `tests/image` runs it: stdlib only, so it also runs as a command.

    python3 -m tests.image.build        # from the project root

No container registry is reachable here, so both build arguments point at locally imported images:
`BASE_IMAGE` is a `debootstrap --variant=minbase` bookworm with python3 (cached as `cae-test/base:bookworm`),
`NODE_IMAGE` holds this host's Node >= 20 (cached as `cae-test/node:host`). The build uses `--network host`
(pip, npm and apt registries during the build).

A cold build spends minutes downloading, so `.ci/run` starts this command in the background as soon as its
dockerd is up, and the downloads overlap the rest of CI. Builds hold an exclusive lock (on the Dockerfile), so
the test's own build waits for one under way and then finds every layer in the cache instead of doing the work
a second time beside it.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_TAG = "cae-test/base:bookworm"
NODE_TAG = "cae-test/node:host"
APP_TAG = "cae-test/app:ci"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_ENV = ("NODE_EXTRA_CA_CERTS", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""Pointed at the base's CA bundle, so node, pip and Python's ssl in the build trust what this host trusts."""
BUILD_TIMEOUT_S = 1200


class Unavailable(Exception):
    """What this machine lacks to build the image (the test skips with it)."""


class BuildFailed(Exception):
    """The build ran and failed: the end of its output."""


def docker(*args: str, timeout: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout, check=False)


def require_docker() -> None:
    if shutil.which("docker") is None:
        raise Unavailable("no docker CLI (apt-get install docker.io; .ci/run does)")
    info = docker("info", "--format", "{{.ServerVersion}}", timeout=20)
    if info.returncode != 0:
        why = info.stderr.decode()[-200:]
        raise Unavailable(f"no dockerd reachable (.ci/run starts one without bridge or iptables): {why}")


def app_image() -> str:
    """Build (or find cached) the app image; its tag. Waits for a build under way in another process."""
    require_docker()
    with open(ROOT / "Dockerfile", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = docker(
            "build", "--force-rm", "--network", "host", "--build-arg", f"BASE_IMAGE={_base_image()}",
            "--build-arg", f"NODE_IMAGE={_node_image()}", "-t", APP_TAG, str(ROOT), timeout=BUILD_TIMEOUT_S,
        )
    if build.returncode != 0:
        raise BuildFailed(build.stderr.decode()[-4000:])
    return APP_TAG


def _have(tag: str) -> bool:
    return docker("image", "inspect", tag, timeout=30).returncode == 0


def _import(tar_bytes: bytes, tag: str, *changes: str) -> None:
    flags = [arg for change in changes for arg in ("--change", change)]
    done = docker("import", *flags, "-", tag, stdin=tar_bytes, timeout=600)
    if done.returncode != 0:
        raise BuildFailed(done.stderr.decode())


def _base_image() -> str:
    if _have(BASE_TAG):
        return BASE_TAG
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise Unavailable("building the base image needs root and debootstrap (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="cae-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(rootfs), DEBIAN_MIRROR],
            check=True, capture_output=True, timeout=900,
        )
        _trust_host_cas(rootfs)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True, capture_output=True, timeout=300)
    _import(tar.stdout, BASE_TAG, *(f"ENV {name}={HOST_CA_BUNDLE}" for name in CA_ENV))
    return BASE_TAG


def _trust_host_cas(rootfs: Path) -> None:
    """Give the base the CAs this host trusts (a TLS-inspecting egress proxy's, say), so pip and npm in the
    build reach their registries the way they do here. The Dockerfile stays free of machine specifics."""
    local = Path("/usr/local/share/ca-certificates")
    if local.is_dir():
        shutil.copytree(local, rootfs / local.relative_to("/"), dirs_exist_ok=True)
    if Path(HOST_CA_BUNDLE).is_file():
        shutil.copy(HOST_CA_BUNDLE, rootfs / HOST_CA_BUNDLE.lstrip("/"))


def _node_image() -> str:
    if _have(NODE_TAG):
        return NODE_TAG
    node, npm = Path("/usr/bin/node"), Path("/usr/lib/node_modules/npm")
    if not node.exists() or not npm.is_dir():
        raise Unavailable("the host has no Node + npm at /usr/bin/node and /usr/lib/node_modules/npm to import")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(node, arcname="usr/local/bin/node")
        tar.add(npm, arcname="usr/local/lib/node_modules/npm")
    _import(buf.getvalue(), NODE_TAG)
    return NODE_TAG


if __name__ == "__main__":
    try:
        print(app_image())
    except (Unavailable, BuildFailed, subprocess.SubprocessError) as exc:
        sys.exit(f"{type(exc).__name__}: {exc}")
