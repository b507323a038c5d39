"""The contracts every process of the orchestrator shares: CLI, service, driver and workers.

    spec/          the job spec: schema, reading, errors, sweeps (`core.spec`)
    storage.py     any pyarrow filesystem by URI: local paths, s3://, gs://, hdfs://
    run_folder.py  a run's folder: its name, its checkpoints' names, what lives where
    jobs.py        a queued job's states, the transitions between them, its resources
    records.py     metrics records: their kinds and field names

Nothing here imports torch, Ray, or the rest of the project, so the service and the CLI
load it in milliseconds and the data plane can import it without a cycle.
"""
