"""The Prometheus config for one orchestrator cluster: the service's endpoint and Ray's own.

`deploy/prometheus/prometheus.yml` is this config for the default addresses (a test keeps them
equal); `orchestrator up` writes it for the cluster it started or joined, with the status
page's real address and the service discovery file of the head's own temp dir.
"""

from __future__ import annotations

import yaml

HEADER = """\
# Prometheus for an orchestrator cluster (Debian's `prometheus` package runs it as is):
#   prometheus --config.file={path}
# - orchestrator: the one endpoint per cluster that the orchestrator service serves
#   (`orchestrator up --metrics-host 0.0.0.0 --metrics-port 8266` to reach it from another
#   machine: it listens on 127.0.0.1 by default). honor_labels keeps our `job` label (a job
#   id) instead of Prometheus's own `job` (the scrape job name).
# - ray: Ray's own metrics (nodes, tasks, Ray Train's controller), found through the service
#   discovery file the Ray head writes under its temp dir
#   ({discovery_note}).
"""
DEFAULT_SERVICE = "127.0.0.1:8266"
DEFAULT_DISCOVERY = "/tmp/ray/prom_metrics_service_discovery.json"
DISCOVERY_FILE = "prom_metrics_service_discovery.json"


def prometheus_config(
    service: str = DEFAULT_SERVICE,
    discovery: str = DEFAULT_DISCOVERY,
    path: str = "deploy/prometheus/prometheus.yml",
    discovery_note: str = "/tmp/ray by default; `orchestrator up` writes this config for its own",
) -> str:
    """The config's text: the service at host:port `service`, Ray's targets from `discovery`."""
    body = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "15s"},
        "scrape_configs": [
            {
                "job_name": "orchestrator",
                "honor_labels": True,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [service]}],
            },
            {"job_name": "ray", "file_sd_configs": [{"files": [discovery]}]},
        ],
    }
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100)
    return HEADER.format(path=path, discovery_note=discovery_note) + text
