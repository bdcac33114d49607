"""A backend module whose SDK is not installed (for the registry's missing-extra error)."""

import coding_agent_env_ghost_sdk  # noqa: F401  (deliberately absent)
