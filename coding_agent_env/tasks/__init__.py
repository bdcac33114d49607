"""Task loading: request files, JSONL datasets and Harbor task directories -> tasks (`models.Task`), each as the
`RolloutRequest` that runs it.

`iter_tasks(sources)` streams `LoadedTask`s (a request, where it came from, what of the task could not be
honoured) and `TaskError`s (a source that is not a task, with its path or line number), one at a time, so a
dataset of any size is read in bounded memory and one bad entry never stops the rest.
"""

from coding_agent_env.tasks.base import LoadedTask, TaskError, TaskOptions
from coding_agent_env.tasks.source import count_tasks, iter_tasks

__all__ = ["LoadedTask", "TaskError", "TaskOptions", "count_tasks", "iter_tasks"]
