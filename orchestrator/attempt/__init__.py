"""One attempt of a job: from its admission (or `orchestrator run`) to its report.

    controller.py   AttemptController, the one owner of an attempt: its state, the loop that
                    dispatches on it, the workers' calls, its listeners
    states.py       the attempt's typed states, the events that move them, its progress
    policy.py       the decisions, pure: what an event or a stop request leads to, what the
                    attempt reports (a failure classified), its exit status
    listeners.py    who is told of each change: the service's record, the metrics log, MLflow,
                    the terminal

docs/architecture.md draws the states and their transitions.
"""
