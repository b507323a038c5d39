"""Is a node dead? What the cluster's own health checks imply, and a probe of our own.

Ray's GCS declares a node dead once its health check of the node's raylet fails `threshold`
times in a row, `period` apart, each check waiting up to `timeout` for an answer. The
defaults (5 checks 3 s apart, 10 s each) take 15 s for a raylet that is gone and over a
minute for a machine that no longer answers; an operator may have set anything. The service
does not bet on a fixed wait:

- `HealthChecks.of_cluster` reads the settings the head's GCS runs with (its environment and
  system config, on the head, where the service runs), and `declare_dead_s` says how long
  Ray may take to declare a node dead under them;
- `probe` opens a TCP connection to a node's raylet: a refused connection (nothing listens
  there: the raylet is gone) or none within `PROBE_TIMEOUT_S` is a reason to think the node
  dead, long before Ray says so. A busy raylet still accepts (the kernel completes the
  handshake), so load alone does not fail a probe.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
from dataclasses import dataclass

import psutil

PROBE_TIMEOUT_S = 2.0
SETTINGS = ("period_ms", "timeout_ms", "failure_threshold", "initial_delay_ms")


@dataclass(frozen=True)
class HealthChecks:
    period_s: float = 3.0  # Ray 2.60's defaults (ray_config_def.h)
    timeout_s: float = 10.0
    threshold: int = 5
    source: str = "Ray's defaults"

    @property
    def declare_dead_s(self) -> float:
        """The longest Ray may take to declare a node dead: every check waits its full timeout."""
        return self.threshold * (self.period_s + self.timeout_s)

    def describe(self) -> str:
        return (
            f"{self.threshold} missed health checks {self.period_s:g} s apart, {self.timeout_s:g} s "
            f"each ({self.source}): Ray declares a node dead within {self.declare_dead_s:.0f} s"
        )

    @classmethod
    def from_values(cls, values: dict[str, float], source: str) -> HealthChecks:
        default = cls()
        return cls(
            period_s=values.get("period_ms", default.period_s * 1000) / 1000,
            timeout_s=values.get("timeout_ms", default.timeout_s * 1000) / 1000,
            threshold=int(values.get("failure_threshold", default.threshold)),
            source=source,
        )

    @classmethod
    def of_cluster(cls, gcs_address: str | None) -> HealthChecks:
        """The settings of the GCS at `gcs_address` when it runs on this machine (read from its
        process), else those this process was started with (the head's raylet hands its
        environment and system config to the processes it starts), else Ray's defaults."""
        values = _gcs_settings(gcs_address) if gcs_address else None
        if values is not None:
            return cls.from_values(values, "the cluster's GCS")
        try:
            from orchestrator.ray.internals import health_check_settings

            return cls.from_values(health_check_settings(SETTINGS), "this head's settings")
        except Exception:  # no Ray here (tests of the pure parts), or Ray renamed them
            return cls()


def _gcs_settings(gcs_address: str) -> dict[str, float] | None:
    """RAY_health_check_* of the gcs_server serving `gcs_address`'s port on this machine: from
    its --config_list (Ray's system config), overridden by its environment; None when no such
    process runs here or it cannot be read."""
    port = gcs_address.rsplit(":", 1)[-1]
    for process in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error, ValueError):
            args = process.info["cmdline"] or []
            if process.info["name"] != "gcs_server" or f"--gcs_server_port={port}" not in args:
                continue
            values: dict[str, float] = {}
            listed = next((a.split("=", 1)[1] for a in args if a.startswith("--config_list=")), "")
            config = json.loads(base64.b64decode(listed) or b"{}") if listed else {}
            environ = process.environ()
            for name in SETTINGS:
                raw = environ.get(f"RAY_health_check_{name}", config.get(f"health_check_{name}"))
                if raw is not None:
                    values[name] = float(raw)
            return values
    return None


def probe(address: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the raylet at address:port accepts a connection, else why not."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return f"no answer in {timeout:g} s"
    except OSError as err:
        return os.strerror(err.errno) if err.errno else type(err).__name__
