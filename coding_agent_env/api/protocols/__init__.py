"""The wire protocols, one module each: `ws` (OpenEnv's `/ws` envelopes), `jsonrpc` (OpenEnv's JSON-RPC),
`mcp` (real MCP over the official SDK), `endpoint` (`/mcp`: one URL, both dialects), `http` (the plain HTTP
routes), `step` (the step path `/ws` and `POST /step` share), `shapes` (the shapes, and `dumps`, the one encoder of
what goes out), `asgi` (raw-ASGI helpers). They take tools from the table (`api.tools`) and never import the web
tab (`api.ui`).
"""
