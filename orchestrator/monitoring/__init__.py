"""Watching the orchestrator and its jobs: Prometheus metrics (`exporter`), the terminal view
(`terminal`) and the live status page in a browser (`web`, its files in `static/`)."""
