"""Ray's autoscaler as the service uses it: the node types it may add, read from its config
file (Ray's cluster YAML: `available_node_types`, each with `resources` and `max_workers`),
and the one standing request the service keeps (`ray.autoscaler.sdk.request_resources`).

Ray keeps no copy of that config where a process can read it, so the service is given the
file (`orchestrator up --autoscaler-config`) or finds it in the command line of the
autoscaler's monitor process, which runs on the head beside the service.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import psutil
import yaml

from orchestrator.policy.autoscale import NodeType
from orchestrator.ray.internals import AUTOSCALER_MONITOR_SCRIPT

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An autoscaler config that cannot be read: one line, naming the file and the field."""


def load_config(path: str) -> dict:
    """{"types": [{name, resources, max_nodes}], "max_workers": N or None}: plain data for the
    service's config. The head's own type is left out: the autoscaler never adds a head."""
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())  # YAML or JSON
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read it: {str(err).splitlines()[0]}") from None
    types = data.get("available_node_types") if isinstance(data, dict) else None
    if not isinstance(types, dict) or not types:
        raise ConfigError(f"{path}: available_node_types: required, a mapping of node types")
    out = []
    for name, spec in types.items():
        if name == data.get("head_node_type"):
            continue
        resources, most = (spec or {}).get("resources", {}), (spec or {}).get("max_workers", 0)
        if not isinstance(resources, dict) or not all(
            isinstance(v, (int, float)) for v in resources.values()
        ):
            raise ConfigError(f"{path}: available_node_types.{name}.resources: a mapping of amounts")
        if not isinstance(most, int) or most < 0:
            raise ConfigError(f"{path}: available_node_types.{name}.max_workers: a whole number >= 0")
        out.append(
            {"name": str(name), "resources": {k: float(v) for k, v in resources.items()}, "max_nodes": most}
        )
    cap = data.get("max_workers")
    return {"types": out, "max_workers": cap if isinstance(cap, int) else None}


def node_types(config: dict) -> list[NodeType]:
    return [NodeType(t["name"], dict(t["resources"]), int(t["max_nodes"])) for t in config["types"]]


def find_config(gcs_address: str | None = None) -> str | None:
    """The config file of the autoscaler running on this machine for the cluster at
    `gcs_address` (a machine may run several clusters: tests do), if one does."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            args = process.info["cmdline"] or []
            if not any(AUTOSCALER_MONITOR_SCRIPT in a for a in args):
                continue
            if gcs_address and f"--gcs-address={gcs_address}" not in args:
                continue  # another cluster's autoscaler
            return next((a.split("=", 1)[1] for a in args if a.startswith("--autoscaling-config=")), None)
    return None


class StandingRequest:
    """The resources the service asks the autoscaler to make room for. Each request replaces
    the last (Ray's semantics); an empty one withdraws it and lets idle nodes go."""

    def __init__(self) -> None:
        self.bundles: list[dict[str, float]] = []

    def set(self, bundles: list[dict[str, float]]) -> None:
        bundles = sorted(bundles, key=lambda b: sorted(b.items()))
        if bundles == self.bundles:
            return
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)
        log.info("autoscaler request: %d bundle(s)", len(bundles))
        self.bundles = bundles


def detected_config(gcs_address: str | None = None) -> dict | None:
    """The config of the autoscaler of the cluster at `gcs_address` on this machine, read; None
    when there is none (or it cannot be read: then the service works with the nodes it has, and
    says why in its log)."""
    path = find_config(gcs_address)
    if path is None:
        return None
    try:
        return load_config(path)
    except ConfigError as err:
        log.warning("autoscaler config not used: %s", err)
        return None
