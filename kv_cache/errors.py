"""Errors a user can cause, and faults that stop a run cleanly.

A ``UserError`` is printed as one sentence (what was wrong, where, what to do)
and the program exits with status 2, never with a traceback.
"""


class UserError(Exception):
    """Bad input: unknown model, malformed setting, unusable cache directory, ..."""


class RunFault(Exception):
    """A fault during the measured run (disk full, I/O error): stop, drain, write partial results."""


class ServerDown(RunFault):
    """A remote tier's server stopped answering within its timeout: the run's later calls to it fail at once."""


class Abandoned(Exception):
    """A request still in flight when the run's drain time ran out: stopped between two block operations."""


class BlockVanished(KeyError):
    """A block another process held in a shared tier was evicted before it could be read."""
