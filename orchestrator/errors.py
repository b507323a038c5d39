"""Errors every command and the service's client share."""


class UsageError(Exception):
    """Bad input from the user (an option, a missing service): printed as one line, exit status 2."""
