"""What the orchestrator ships for those who test and measure against it (as Ray ships
`ray.cluster_utils` and PyTorch `torch.testing`): real services on this machine, started as a
user or an operator would start them, each on free ports and stopped by its own process group.

- `local_cluster`: a real Ray cluster (`ray start`): a head with token auth, worker nodes that
  are machines of their own (mount namespaces), Ray's autoscaler with its fake provider, a
  Redis-backed GCS to restart; Ray's state API (`list_nodes`, `list_actors`, `state_api`).
- `s3_server`: a real S3 API server (`moto_server`, from the `dev` extra) with a bucket.

The tests (`tests/conftest.py`'s fixtures) and the benchmarks (`bench/`) use them; nothing of
the product imports them. Each module is imported on its own (nothing is imported here).
"""
