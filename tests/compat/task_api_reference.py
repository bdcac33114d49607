"""openenv 0.10's own server (`openenv.core.env_server.http_server.create_fastapi_app`) serving a task set given
as JSON, run in the released package's virtualenv: the reference our Task API is compared with
(tests/compat/test_task_api.py).

    python task_api_reference.py PORT ENV_NAME TASKS_JSON     # TASKS_JSON: {"splits": [...], "tasks": {split: [...]}}

The environment implements OpenEnv's `TaskProvider` methods over that data, raising what its docstring says
(`IndexError` out of range); an unknown split raises `KeyError`, as a dict lookup does.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

PORT, ENV_NAME, DATA = int(sys.argv[1]), sys.argv[2], json.loads(open(sys.argv[3], encoding="utf-8").read())


class TaskSet(Environment):
    def reset(self, seed: Any = None, episode_id: Any = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=None, metadata={})

    def step(self, action: Action, timeout_s: Any = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=None, metadata={})

    @property
    def state(self) -> State:
        return State()

    def list_splits(self) -> list[Any]:
        return DATA["splits"]

    def list_tasks(self, split: str) -> list[Any]:
        return DATA["tasks"][split]

    def num_tasks(self, split: str) -> int:
        return len(DATA["tasks"][split])

    def get_task(self, split: str, index: int) -> Any:
        tasks = DATA["tasks"][split]
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return tasks[index]

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[Any]:
        return DATA["tasks"][split][start:stop]


app = create_fastapi_app(TaskSet, Action, Observation, env_name=ENV_NAME)
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
