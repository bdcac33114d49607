"""The tab's mounting: on by default at /web with `/` redirecting to it, absent with ENABLE_WEB_INTERFACE=false."""

from __future__ import annotations

import httpx

from coding_agent_env.api import build_app
from coding_agent_env.settings import Settings


async def _get(settings: Settings, *paths: str) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=build_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return [await client.get(path) for path in paths]


async def test_web_is_mounted_and_root_redirects(settings: Settings) -> None:
    root, web, page, health = await _get(settings, "/", "/web", "/web/", "/health")
    assert root.status_code == web.status_code == 307
    assert root.headers["location"] == web.headers["location"] == "/web/"
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert health.json() == {"status": "healthy"}


async def test_web_interface_can_be_turned_off(settings: Settings) -> None:
    settings = Settings.from_env({"ENABLE_WEB_INTERFACE": "false"}, state_dir=settings.state_dir)
    assert settings.enable_web_interface is False
    root, page, health = await _get(settings, "/", "/web/", "/health")
    assert root.status_code == page.status_code == 404 and health.status_code == 200
