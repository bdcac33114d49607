"""The web tab behind the caller token (INTEGRITY 39): with API_TOKEN set, gradio's own login guards the tab and
its API (any user name, the token as password); without a login its config, API and queue answer 401. Real
gradio under the real server."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.helpers import wait_until
from tests.protocol.live import LiveServer

TOKEN = "web-tok-41c9"
BUILD_DEADLINE_S = 120.0


def test_the_tab_needs_a_login_with_the_token(make_live: Callable[..., LiveServer]) -> None:
    server = make_live(api_token=TOKEN)
    with httpx.Client(base_url=server.http, timeout=30) as web:
        wait_until(lambda: web.get("/web/").status_code != 503, "the tab to be built", timeout_s=BUILD_DEADLINE_S,
                   interval_s=0.2)
        for path in ("/web/config", "/web/gradio_api/info"):
            assert web.get(path).status_code == 401, path
        assert web.post("/web/gradio_api/queue/join", json={}).status_code == 401
        assert web.post("/web/login", data={"username": "me", "password": "wrong"}).status_code == 400
        assert web.get("/web/config").status_code == 401
        assert web.post("/web/login", data={"username": "me", "password": TOKEN}).status_code == 200
        assert web.get("/web/config").status_code == 200


RUN_HISTORY_PATHS = ("/web/gradio_api/run-history/buckets", "/web/gradio_api/run-history/records?bucket=me/b")


def test_no_tab_route_outside_the_login_reaches_the_hub(make_live: Callable[..., LiveServer]) -> None:
    """gradio's run history answers without its login and, to a browser on loopback, acts with the host's own
    Hugging Face token (the operator's HF_TOKEN); the token middleware leaves `/web/` to gradio's login, so those
    routes must not exist. No token is configured here (nothing may reach the Hub): before the fix gradio answers
    401 "sign in to use run history" from a route that exists; after it, 404."""
    server = make_live(api_token=TOKEN)
    with httpx.Client(base_url=server.http, timeout=30) as web:
        wait_until(lambda: web.get("/web/").status_code != 503, "the tab to be built", timeout_s=BUILD_DEADLINE_S,
                   interval_s=0.2)
        for path in RUN_HISTORY_PATHS:
            assert web.get(path).status_code == 404, path
        assert web.post("/web/gradio_api/run-history/connect", json={"bucket_id": "me/b"}).status_code == 404
