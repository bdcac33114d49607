"""What the server does, for its operators: Prometheus metrics (`observe.metrics`, served at `GET /metrics`).

A layer of its own below `session` and `api`: it imports only the wire models, the settings and its own
libraries, so the session and the app may hand it what they see."""
