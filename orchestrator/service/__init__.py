"""The orchestrator service: the detached Ray actor that runs the policy (`orchestrator/policy/`)
on a live cluster, and everything it does that touches the world. Each module is imported on
its own (nothing is imported here, so a module of it loads only what it needs):

- `actor`: the service actor and the calls it answers; `cycle`: its scheduling pass.
- `lifecycle`: every change of a job's state; `store`: the durable job table in storage.
- `submission`: a submitted job becomes a record (and its project a package in the store).
- `runner`: drivers started through Ray's Jobs API; `progress`: a driver's report folded in.
- `health`: the watch over running jobs and what the service does about hangs and stragglers;
  `stacks`: the stacks of a hung job's ranks, and ending them.
- `live`: the newest metrics of the jobs that report; `views`: what the service shows.
- `tenants`: the users, their tokens (as hashes) and who a token names; `audit`: the log of
  every state-changing call; `documents`: the whole-file JSON writes both use.
- `http_calls`: the service's HTTP API beyond the status page's reads (submit, stop, preempt,
  queues, users, audit, sweeps), added to the page's server (`orchestrator/monitoring/web.py`).

How anything outside the service reaches it is `orchestrator/client.py`. Design notes:
docs/scheduler.md.
"""
