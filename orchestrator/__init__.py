"""Control plane: the job spec, the CLI, the Ray driver, storage checks."""

__version__ = "0.1.0"
