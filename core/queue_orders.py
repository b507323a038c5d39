"""The orders a queue's waiting jobs run in, apart from the queue config's schema (`core.queues`)
so that a client that only shows a queue need not load pydantic to name them."""

ORDERS = ("fifo", "las", "las-share")
LAS_ORDERS = ("las", "las-share")  # one `las:` block and one LAS serve them, so a file uses one
DEFAULT_ORDER = "las-share"  # issue 34: it meets every target on the Philly VCs (docs/scheduler.md)
