"""`orchestrator queues apply FILE | --clear` and `orchestrator queues show`: the queue configuration.

The file (queues, cohorts, nominal quotas, borrowing limits, orders; `core/queues.py`) is
validated here, once, before anything is sent: a bad file is one line per problem, naming
the field, exit status 2, and the running configuration stays as it was. The service gets
the typed `QueueConfig`, swaps its policy and keeps the file's content in its store
(`<store>/queues.json`), so that a restarted service applies it again. docs/scheduler.md
("Queues, LAS and fair share") says what the fields do.
"""

from __future__ import annotations

import json

from orchestrator.commands.options import add_address, with_cluster_errors
from orchestrator.commands.queue_views import read_queue
from orchestrator.errors import UsageError


def register(sub) -> None:
    queues = sub.add_parser("queues", help="the queue configuration: cohorts, quotas, LAS")
    verbs = queues.add_subparsers(dest="verb", metavar="VERB", required=True)
    apply = verbs.add_parser("apply", help="validate a queue configuration file and apply it")
    apply.add_argument("file", nargs="?", metavar="FILE", help="the queue configuration (YAML)")
    apply.add_argument("--clear", action="store_true", help="remove the configuration: every queue las-share")
    add_address(apply)
    apply.set_defaults(handler=with_cluster_errors(handle_apply))
    show = verbs.add_parser("show", help="the configuration applied and each queue's use")
    show.add_argument("--json", action="store_true", help="as JSON")
    add_address(show)
    show.set_defaults(handler=with_cluster_errors(handle_show))


def handle_apply(args) -> int:
    from core.queues import load_queue_config
    from orchestrator import client
    from orchestrator.commands.queue import queue_lines

    if bool(args.file) == bool(args.clear):
        raise UsageError("queues apply: give a FILE, or --clear to remove the configuration")
    config = None if args.clear else load_queue_config(args.file)  # SpecError: exit 2, one line each
    raw = None if config is None else config.model_dump(mode="json")  # as the service stores it
    route = ("PUT", "queues", {"config": raw})
    try:
        view = client.through_service(args.address, route, "set_queues", config, client.caller_token())
    except client.Refused as err:
        raise client.Refused(f"queues apply: {err}") from None
    if view is None:
        print("queue configuration removed: every queue has the default order, las-share")
        return 0
    print(f"queue configuration applied: {len(view['use'])} queue(s)")
    for line in queue_lines(view):
        print(f"  {line}")
    return 0


def handle_show(args) -> int:
    import yaml

    from orchestrator.commands.queue import queue_lines

    _, info = read_queue(args.address, include_finished=False)
    view = info.get("queues")
    if args.json:
        print(json.dumps(view, indent=1, sort_keys=True))
        return 0
    if view is None:
        print("no queue configuration: every queue has the default order, las-share")
        return 0
    print(yaml.safe_dump(view["config"], sort_keys=False).rstrip())
    print()
    for line in queue_lines(view):
        print(line)
    return 0
