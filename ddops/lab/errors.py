"""Errors of the lab and install parts: one line naming what failed and why. Their exit codes
come from their causes (ddops.exits): a lab host or an install step that failed needs an
operator (3); a bad count, host name or setting, or not being root, is bad input (2)."""

from ddops import exits


class LabError(exits.HostFailed):
    """A lab operation failed; the message is one line with the cause and, where useful, a hint."""


class LabUsageError(exits.BadInput, LabError):
    """Bad input (a host name, a count, a lab setting): nothing was touched."""


class NotRootError(LabUsageError):
    """The lab creates namespaces, bridges and containers: only root may do that."""
