"""The Prometheus config for one orchestrator cluster: the service's endpoint and Ray's own,
and the alerting rules shipped beside it (`deploy/prometheus/alerts.yml`).

`deploy/prometheus/prometheus.yml` is this config for the default addresses (a test keeps them
equal); `orchestrator up` writes it for the cluster it started or joined, with the status
page's real address and the service discovery file of the head's own temp dir.

Rule files. Prometheus reads a relative `rule_files` path from the config file's own folder,
so the shipped config names `alerts.yml` (beside it) and stays the same on every machine; a
config written anywhere else names the shipped file by its absolute path when the package runs
from the repository (a checkout, an editable install), and none when it was installed from a
wheel, which has no `deploy/` folder.
"""

from __future__ import annotations

from pathlib import Path

import yaml

HEADER = """\
# Prometheus for an orchestrator cluster (Debian's `prometheus` package runs it as is):
#   prometheus --config.file={path}
# - orchestrator: the one endpoint per cluster that the orchestrator service serves
#   (`orchestrator up --metrics-host 0.0.0.0 --metrics-port 8266` to reach it from another
#   machine: it listens on 127.0.0.1 by default). honor_labels keeps our `job` label (a job
#   id) instead of Prometheus's own `job` (the scrape job name). `authorization` (in the
#   config `orchestrator up` writes) sends a read-only token of the service's: beyond
#   127.0.0.1 every request needs one.
# - ray: Ray's own metrics (nodes, tasks, Ray Train's controller), found through the service
#   discovery file the Ray head writes under its temp dir
#   ({discovery_note}).
# - rule_files: the alerting rules (deploy/prometheus/alerts.yml; their unit tests:
#   promtool test rules deploy/prometheus/alerts_test.yml). Firing alerts show at /alerts.
"""
DEFAULT_SERVICE = "127.0.0.1:8266"
DEFAULT_DISCOVERY = "/tmp/ray/prom_metrics_service_discovery.json"
DISCOVERY_FILE = "prom_metrics_service_discovery.json"
SHIPPED = "deploy/prometheus/prometheus.yml"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def rules_for(path: str) -> list[str]:
    """The rule files a config written at `path` names: the shipped rules, relative beside
    the shipped config, absolute elsewhere; none when this installation lacks them."""
    if path == SHIPPED:
        return [RULES.name]
    return [str(RULES)] if RULES.is_file() else []


def prometheus_config(
    service: str = DEFAULT_SERVICE,
    discovery: str = DEFAULT_DISCOVERY,
    path: str = SHIPPED,
    discovery_note: str = "/tmp/ray by default; `orchestrator up` writes this config for its own",
    credentials_file: str | None = None,
) -> str:
    """The config's text, to be written at `path`: the service at host:port `service` (scraped
    with the bearer token in `credentials_file`, if given), Ray's targets from `discovery`,
    the shipped alerting rules."""
    orchestrator = {
        "job_name": "orchestrator",
        "honor_labels": True,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [service]}],
    }
    if credentials_file:
        orchestrator["authorization"] = {"type": "Bearer", "credentials_file": credentials_file}
    body = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "15s"},
        "rule_files": rules_for(path),
        "scrape_configs": [
            orchestrator,
            {"job_name": "ray", "file_sd_configs": [{"files": [discovery]}]},
        ],
    }
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100)
    return HEADER.format(path=path, discovery_note=discovery_note) + text
