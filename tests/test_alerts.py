"""The shipped alerting rules (deploy/prometheus/alerts.yml): valid for promtool, each rule
unit-tested by promtool against made-up series (alerts_test.yml), loaded by a real Prometheus
from the shipped config and from the config `orchestrator up` writes.

Needs Debian's `prometheus` package (`prometheus` and `promtool`); without it these tests
fail, saying so, rather than skip: the rules would otherwise ship unchecked. No Ray.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from orchestrator.monitoring.exporter import EXPORTED
from orchestrator.monitoring.prometheus_config import RULES, prometheus_config
from tests.conftest import ROOT
from tests.test_monitoring import dashboard_queries

DEPLOY = ROOT / "deploy" / "prometheus"


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"`{name}` is not installed: apt-get install prometheus (it brings promtool too)"
    return found


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=120)


def rules() -> list[dict]:
    groups = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules():
    check = promtool("check", "rules", str(DEPLOY / "alerts.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(rules())} rules found" in check.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    test = promtool("test", "rules", str(DEPLOY / "alerts_test.yml"))
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_rule_is_an_alert_with_a_severity_and_a_test_that_fires_it():
    tests = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    for rule in rules():
        assert "alert" in rule, rule
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert rule["alert"] in fired, f"{rule['alert']}: no test in alerts_test.yml fires it"
    wanted = {"hung", "straggler", "goodput", "queue", "node"}
    names = " ".join(rule["alert"].lower() for rule in rules())
    assert all(word in names for word in wanted), names


def test_the_rules_read_only_metrics_the_service_or_prometheus_produce():
    exported = set(EXPORTED)
    for rule in rules():
        names = set(re.findall(r"\borchestrator_[a-z0-9_]+", rule["expr"]))
        assert names <= exported, f"{rule['alert']}: {names - exported}"
        assert names or re.search(r"\bup\{", rule["expr"]), rule["alert"]


def test_the_shipped_config_names_the_rules_beside_it_and_passes_promtool():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"] and (DEPLOY / "alerts.yml").is_file()
    check = promtool("check", "config", str(DEPLOY / "prometheus.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 rule files found" in check.stdout


def test_the_config_up_writes_names_the_shipped_rules_by_their_absolute_path(tmp_path):
    path = tmp_path / "prometheus.yml"  # anywhere but deploy/: ~/.orchestrator/ for `up`
    path.write_text(prometheus_config("127.0.0.1:8266", str(tmp_path / "sd.json"), str(path)))
    assert yaml.safe_load(path.read_text())["rule_files"] == [str(RULES)]
    assert RULES == DEPLOY / "alerts.yml" and RULES.is_absolute()
    check = promtool("check", "config", str(path))
    assert check.returncode == 0, check.stdout + check.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loaded_rules(config: Path, tmp_path: Path) -> list[str]:
    """The alerting rules a real Prometheus server loaded from `config`."""
    port = _free_port()
    log = open(tmp_path / "prometheus.log", "w")
    server = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/api/v1/rules?type=alert"
                with urllib.request.urlopen(url, timeout=5) as response:
                    groups = json.loads(response.read())["data"]["groups"]
                return [rule["name"] for group in groups for rule in group["rules"]]
            except OSError:
                time.sleep(0.5)
        log_text = (tmp_path / "prometheus.log").read_text()
        raise AssertionError(f"Prometheus did not answer: {log_text[-3000:]}")
    finally:
        server.terminate()
        server.wait(30)
        log.close()


@pytest.mark.timeout(120)
def test_a_prometheus_server_loads_every_rule_from_the_shipped_and_the_written_config(tmp_path):
    every = sorted(rule["alert"] for rule in rules())
    (tmp_path / "shipped").mkdir()
    assert sorted(loaded_rules(DEPLOY / "prometheus.yml", tmp_path / "shipped")) == every
    written = tmp_path / "up" / "prometheus.yml"
    written.parent.mkdir()
    written.write_text(prometheus_config("127.0.0.1:8266", str(tmp_path / "sd.json"), str(written)))
    assert sorted(loaded_rules(written, written.parent)) == every


def test_every_promql_expression_of_the_grafana_dashboard_parses(tmp_path):
    """promtool parses the dashboard's queries as recording rules (`$job` as Grafana fills it)."""
    dashboard = json.loads((ROOT / "deploy/grafana/orchestrator.json").read_text())
    exprs = dashboard_queries(dashboard)
    recorded = [
        {"record": f"dashboard:query{i}", "expr": expr.replace("$job", ".*")} for i, expr in enumerate(exprs)
    ]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": recorded}]}))
    check = promtool("check", "rules", str(tmp_path / "dashboard.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert any("orchestrator_job_time_seconds_total" in e for e in exprs)  # the goodput row
    assert any("orchestrator_cluster_goodput_ratio" in e for e in exprs)
