"""The one exception type a user can cause, and its kinds.

Every error a user can provoke (a malformed spec, a missing privilege or tool, a kernel that
lacks a qdisc, a worker that died) is a :class:`TestbedError`; the CLI prints its message
without a traceback. The message always says what to do.
"""


class TestbedError(Exception):
    """An error the user can act on; ``str(err)`` says what went wrong and what to do."""

    __test__ = False  # not a pytest test class despite its name


class SpecError(TestbedError):
    """A malformed experiment spec.

    Args:
        field: dotted path of the offending field, e.g. ``topology.host_bw_mbps``.
        value: the value given.
        allowed: what is allowed, in words.
    """

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"spec field '{field}': got {value!r}; allowed: {allowed}")


class MissingRequirement(TestbedError):
    """The machine lacks a privilege, a tool or a kernel feature (message names the remedy)."""


class RunFailed(TestbedError):
    """A run ended abnormally: a process died, the run timed out, or teardown found a problem."""
