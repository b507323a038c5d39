"""The orchestrator service as the status page's `PageSource` (see web.py), and what the page
shows of the service's own process."""

from __future__ import annotations

import logging
import os
import sys

from orchestrator.monitoring.queue_query import QueueQuery

log = logging.getLogger("orchestrator.service")


def serve_page(service, host: str, port: int):
    """The status page, its HTTP API and /metrics of `service`, on host:port: (the server, its
    URL), or (None, None) when the port cannot be had (the queue matters more than the page).
    Every route asks the service's door who the request's token names (monitoring/web_auth.py)."""
    from orchestrator.monitoring.exporter import registry_for
    from orchestrator.monitoring.web import make_app, serve

    try:
        view = PageView(service)
        app = make_app(view, registry_for(service), submitter=service, gate=service.door, calls=service)
        return serve(app, host, port)
    except OSError as err:
        log.error("status page and metrics not served on %s:%s: %s", host, port, err)
        return None, None


class PageView:
    def __init__(self, service):
        self.service = service

    def info(self) -> dict:
        return self.service.info()

    def queue(self, waiting: int | None = None, finished: bool = True) -> list[dict]:
        return self.service.queue(include_finished=finished, waiting=waiting)

    def queue_page(self, query: QueueQuery) -> dict:
        return self.service.queue_page(query)

    def job(self, job_id: str) -> dict | None:
        try:
            view = self.service.status(job_id)
        except KeyError:
            return None
        view["checkpoints"] = self.service.checkpoints(job_id)
        return view

    def metrics(self, job_id: str, since_step: int, newest: int | None = None) -> list[dict]:
        return self.service.metrics_since(job_id, since_step, newest)


# What of `workers/` the service may load: the catalogue a spec sent over HTTP is checked against
# (service/sent_spec.py: model families and presets, data sources' shapes), ~1 MiB, no torch.
SPEC_CATALOGUE = ("workers.checks", "workers.data", "workers.models")


def process_info() -> dict:
    """The service's own process: its memory, and which of the heavy packages it has loaded
    (none of the data plane's: the control plane never imports torch, kernels or training code)."""
    import psutil

    return {
        "pid": os.getpid(),
        "rss_bytes": psutil.Process().memory_info().rss,
        "data_plane_modules": data_plane_modules(sys.modules),
    }


def data_plane_modules(names) -> list[str]:
    """torch, kernels, triton, and the modules of `workers/` beyond the spec's catalogue."""
    heavy = {name.split(".")[0] for name in names} & {"torch", "kernels", "triton"}
    training = {
        name
        for name in names
        if name.startswith("workers.")
        and not any(name == c or name.startswith(c + ".") for c in SPEC_CATALOGUE)
    }
    return sorted(heavy | training)
