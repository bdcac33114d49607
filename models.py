"""OpenEnv package face: the wire models, defined in coding_agent_env.models."""

from coding_agent_env.models import *  # noqa: F403
from coding_agent_env.models import __all__  # noqa: F401
