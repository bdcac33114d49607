"""STAND-IN for agent-sandbox's in-pod python runtime (examples/python-runtime-sandbox), stdlib only.

Run inside a stand-in pod (a container, see k8s_standin.py) as `python3 k8s_pod_runtime.py SOCKET BASE_DIR`. It
serves the runtime's HTTP API on a unix socket (the pod has no network): `GET /` health, `POST /execute`
(`{"command", "timeout_seconds"}`: the command is `shlex.split`, never a shell, run from BASE_DIR in its own
process group, killed as a group at the timeout; reply `{"stdout", "stderr", "exit_code", "timed_out"}`),
`POST /upload` (multipart, the part's filename a path under BASE_DIR; parents made), `GET /download/<quoted>`
(404 when not a file), `GET /exists/<quoted>`. Written from the runtime's documented wire shape, not its code.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import os
import shlex
import signal
import socketserver
import subprocess
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler

_DEFAULT_TIMEOUT_S = 300.0


def _safe(base: str, path: str) -> str:
    """`path` under `base` (symlinks resolved), or ValueError."""
    root = os.path.realpath(base)
    full = os.path.realpath(os.path.join(root, path.lstrip("/")))
    if os.path.commonpath([root, full]) != root:
        raise ValueError("outside the base directory")
    return full


class Handler(BaseHTTPRequestHandler):
    base = "/"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet; no client address on a unix socket
        return

    def address_string(self) -> str:
        return "pod"

    def _reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: object) -> None:
        self._reply(status, json.dumps(value).encode())

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        if path == "/":
            return self._json(200, {"status": "ok"})
        verb, _, rest = path.lstrip("/").partition("/")
        name = urllib.parse.unquote(rest)
        try:
            full = _safe(self.base, name)
        except ValueError:
            return self._json(403, {"message": "Access denied"})
        if verb == "download":
            if not os.path.isfile(full):
                return self._json(404, {"message": "File not found"})
            with open(full, "rb") as f:
                return self._reply(200, f.read(), "application/octet-stream")
        if verb == "exists":
            return self._json(200, {"path": name, "exists": os.path.exists(full)})
        return self._json(404, {"message": "no such endpoint"})

    def do_POST(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        if path == "/execute":
            return self._execute(json.loads(self._body()))
        if path == "/upload":
            return self._upload()
        return self._json(404, {"message": "no such endpoint"})

    def _execute(self, request: dict[str, object]) -> None:
        timeout = float(request.get("timeout_seconds") or _DEFAULT_TIMEOUT_S)  # type: ignore[arg-type]
        try:
            args = shlex.split(str(request["command"]))
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.base,
                                    start_new_session=True)
        except (OSError, ValueError) as exc:
            return self._json(200, {"stdout": "", "stderr": f"Failed to execute command: {exc}", "exit_code": 1})
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        self._json(200, {"stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace"),
                         "exit_code": proc.returncode, "timed_out": timed_out})

    def _upload(self) -> None:
        head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self._body())
        for part in message.iter_parts():
            name = part.get_filename()
            if not name:
                continue
            try:
                full = _safe(self.base, name)
            except ValueError:
                return self._json(403, {"message": "Access denied"})
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(part.get_payload(decode=True) or b"")
            return self._json(200, {"message": f"File '{name}' uploaded successfully."})
        return self._json(400, {"message": "no file part"})


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> None:
    socket_path, Handler.base = sys.argv[1], sys.argv[2]
    with Server(socket_path + ".new", Handler) as server:
        os.chmod(socket_path + ".new", 0o666)
        os.rename(socket_path + ".new", socket_path)  # the socket appears only once it listens
        server.serve_forever()


if __name__ == "__main__":
    main()
