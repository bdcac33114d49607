"""OpenEnv package face: the client, defined in coding_agent_env.client."""

from coding_agent_env.client import *  # noqa: F403
from coding_agent_env.client import __all__  # noqa: F401
