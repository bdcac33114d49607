"""OpenEnv 0.10's Task API over the server's task set (`tasks.catalog`), answering as openenv's own server does.

    GET  /list_environments          -> ["coding_agent_env"]
    GET  /{env}/splits               -> [{"name", "type", "num_tasks"}]
    POST /{env}/tasks      {split, limit?, cursor?} -> {"tasks": [...], "env_name": "coding_agent_env"}
                                                   (+ "next_cursor" when paged)
    POST /{env}/num_tasks  {split}   -> {"num_tasks": n}
    POST /{env}/task       {split, index}        -> {"task": {...}}
    POST /{env}/task_range {split, start?, stop?} -> {"tasks": [...]}   (Python slice bounds)

As openenv 0.10 (`openenv/core/env_server/http_server.py`, checked against its source): `{env}` is matched
case-insensitively, else 404 `unknown environment 'x'`; a body with a missing or extra field is FastAPI's 422;
an index out of range is 400 `Invalid task index`; a server without a task set answers 501 `<method> is not
supported for this environment`. Where openenv leaves the answer to the environment (an unknown split: its own
Harbor environment raises a bare error, a 500) this server says 404 `unknown split 'x'; this server's splits
are [...]`. Tasks are their public part only (`CatalogTask.public`).

Large answers: `tasks` and `task_range` answers are streamed, serialised a chunk at a time off the event loop
(`task_stream`), so a 100,000-task split costs the loop no more than a small one. `tasks` also pages (ours, not
openenv's): with `limit` (1..`MAX_PAGE`; a `cursor` alone: `MAX_PAGE`) the answer holds at most that many
tasks from `cursor` (the opaque string a previous page gave as `next_cursor`; none: the start) and
`next_cursor`, to pass on for the next page (null on the last). A
request without `limit` gets the whole split, as openenv 0.10's clients expect. A cursor that is not one this
server gave for the split is 400 `Invalid cursor`.

With the server's metrics every request is counted by its route (the path template, never the path sent) and
the status code it was answered with (`coding_agent_env_task_api_requests_total`), the 422s FastAPI answers for a
bad body included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from coding_agent_env.api.protocols.task_stream import tasks_response
from coding_agent_env.observe.metrics import ServerMetrics
from coding_agent_env.tasks.catalog import CatalogTask, NoTaskSetError, TaskCatalog, TaskIndexError, UnknownSplitError

__all__ = ["MAX_PAGE", "build_task_router"]

MAX_PAGE = 10_000
"""The largest `limit` a `tasks` page may ask for."""
_CURSOR = re.compile(r"^[0-9]{1,12}$")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SplitBody(_Body):
    split: str = Field(description="Task split name")


class ListBody(SplitBody):
    limit: int | None = Field(default=None, ge=1, le=MAX_PAGE,
                              description="At most this many tasks (a page); none: the whole split")
    cursor: str | None = Field(default=None, max_length=32,
                               description="Where the page starts: a previous page's next_cursor; none: the start")


class TaskBody(_Body):
    split: str = Field(description="Task split name")
    index: int = Field(description="Task index within the split")


class RangeBody(_Body):
    split: str = Field(description="Task split name")
    start: int | None = Field(default=None, description="Inclusive start index")
    stop: int | None = Field(default=None, description="Exclusive stop index")


def _counted_route(metrics: ServerMetrics) -> type[APIRoute]:
    """A route class counting each request by its path template and the status it was answered with (an
    `HTTPException`'s, 422 for a body FastAPI refuses, 500 for anything else raised)."""

    class CountedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            route = self.path

            async def counted(request: Request) -> Response:
                code = 500
                try:
                    response = await handler(request)
                    code = response.status_code
                    return response
                except HTTPException as exc:
                    code = exc.status_code
                    raise
                except RequestValidationError:
                    code = 422
                    raise
                finally:
                    metrics.task_api_request(route, code)

            return counted

    return CountedRoute


def build_task_router(catalog: TaskCatalog, env_name: str,
                      metrics: ServerMetrics | None = None) -> APIRouter:
    """The Task API's routes; with `metrics`, each request counted (module docstring)."""
    router = APIRouter(tags=["Task API"]) if metrics is None else \
        APIRouter(tags=["Task API"], route_class=_counted_route(metrics))

    def check(name: str, method: str) -> None:
        if name.lower() != env_name.lower():
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"unknown environment {name!r}")
        if not catalog:
            raise HTTPException(status.HTTP_501_NOT_IMPLEMENTED, detail=f"{method} is not supported for this environment")

    def tasks_of(split: str) -> Sequence[CatalogTask]:
        try:
            return catalog.tasks(split)
        except UnknownSplitError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None
        except NoTaskSetError as exc:  # checked above; kept so a change there cannot turn into a 500
            raise HTTPException(status.HTTP_501_NOT_IMPLEMENTED, detail=str(exc)) from None

    @router.get("/list_environments")
    async def list_environments() -> list[str]:
        return [env_name]

    @router.get("/{env}/splits")
    async def splits(env: str) -> list[dict[str, Any]]:
        check(env, "list_splits")
        return catalog.splits()

    @router.post("/{env}/tasks", response_model=None)
    async def list_tasks(env: str, body: ListBody) -> Response:
        check(env, "list_tasks")
        tasks = tasks_of(body.split)
        if body.limit is None and body.cursor is None:
            return tasks_response(tasks, {"env_name": env_name})
        start = _page_start(body.cursor, len(tasks))
        stop = start + (body.limit or MAX_PAGE)
        next_cursor = str(stop) if stop < len(tasks) else None
        return tasks_response(tasks[start:stop], {"env_name": env_name, "next_cursor": next_cursor})

    @router.post("/{env}/num_tasks")
    async def num_tasks(env: str, body: SplitBody) -> dict[str, Any]:
        check(env, "num_tasks")
        return {"num_tasks": len(tasks_of(body.split))}

    @router.post("/{env}/task")
    async def get_task(env: str, body: TaskBody) -> dict[str, Any]:
        check(env, "get_task")
        tasks_of(body.split)  # an unknown split is 404 before the index is looked at
        try:
            return {"task": catalog.get(body.split, body.index).public()}
        except TaskIndexError:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="Invalid task index") from None

    @router.post("/{env}/task_range", response_model=None)
    async def get_task_range(env: str, body: RangeBody) -> Response:
        check(env, "get_task_range")
        return tasks_response(tasks_of(body.split)[body.start:body.stop])

    return router


def _page_start(cursor: str | None, size: int) -> int:
    """The index a page starts at: 0 without a cursor; 400 for a cursor this server cannot have given."""
    if cursor is None:
        return 0
    if not _CURSOR.match(cursor) or not 0 < int(cursor) < size:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="Invalid cursor")
    return int(cursor)
