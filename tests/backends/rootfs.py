"""The Docker test image, built offline: a skeleton root filesystem as a tar, for `docker import`.

It holds no programs: containers of it bind the host's /usr read-only (bash, python3 and coreutils come from
there; Debian's merged /usr makes /bin, /lib and /lib64 symlinks into it). Run as a script it writes the tar
to stdout (`python3 tests/backends/rootfs.py | docker import - cae-test:1`).
"""

from __future__ import annotations

import io
import sys
import tarfile
from typing import Any

IMAGE = "coding-agent-env-test:2"
"""Its tag changes with its files (2: `nobody` and `nogroup`, which a Harbor verifier may switch to)."""
HOST_BINDS = ("/usr",)

_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_DIRS = {"usr": 0o755, "etc": 0o755, "tmp": 0o1777, "proc": 0o755, "dev": 0o755, "sys": 0o755, "run": 0o755}
_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
    "etc/hosts": "127.0.0.1 localhost\n",
}


def rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in _DIRS.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, target in _LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, text in _FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_image(client: Any) -> None:
    """Import the test image into the daemon `client` (a docker SDK client) unless it already holds it."""
    import docker.errors

    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        repo, _, tag = IMAGE.partition(":")
        client.api.import_image_from_data(rootfs_tar(), repository=repo, tag=tag)


if __name__ == "__main__":
    sys.stdout.buffer.write(rootfs_tar())
