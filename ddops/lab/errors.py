"""Errors of the lab and install parts: one line naming what failed and why."""


class LabError(Exception):
    """A lab operation failed; the message is one line with the cause and, where useful, a hint."""

    exit_code = 1
    meaning = "lab or install operation failed"


class NotRootError(LabError):
    """The lab creates namespaces, bridges and containers: only root may do that."""

    exit_code = 2
    meaning = None  # the exit code's own meaning (ddops.exits)


class LabUsageError(LabError):
    """Bad input (a host name, a count, a lab setting): nothing was touched."""

    exit_code = 2
    meaning = None  # the exit code's own meaning (ddops.exits)
