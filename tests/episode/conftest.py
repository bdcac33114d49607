"""The episode suite runs on the backend suite's engines (real bwrap, the real dockerd)."""

from tests.backends.conftest import backend_for, docker_engine, hf_server, no_leftover_containers

__all__ = ["backend_for", "docker_engine", "hf_server", "no_leftover_containers"]
