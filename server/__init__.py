"""OpenEnv package face: `server.app:app` for `uvicorn server.app:app`."""
