"""One module per `orchestrator` subcommand."""
