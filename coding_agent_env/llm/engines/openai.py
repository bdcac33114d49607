"""Plain OpenAI-compatible APIs (hosted OpenAI, routers): logprobs only, no token ids at all.

Asked for: `logprobs` (and `top_logprobs`). Returned: `choices[0].logprobs.content[]` (`token`, `logprob`,
`bytes`); no completion or prompt ids, so such turns are context only in a training trace (with a note).
Checked against: the OpenAI chat-completions reference shape (no hosted API is reachable from these machines).
"""

from __future__ import annotations

from coding_agent_env.llm.engines.base import Engine

__all__ = ["ENGINE", "OpenAI"]


class OpenAI(Engine):
    name = "openai"
    checked = "OpenAI chat completions reference shape; no hosted API reachable here"


ENGINE = OpenAI()
