"""hetcluster's own exceptions, one base class; vendor errors are translated here-bound.

Every message says what went wrong and, where it can, how to fix it ("To fix: ..."). The CLI
prints ``str(error)`` as one line and exits non-zero; nothing below the CLI prints.
"""

from __future__ import annotations


class HetclusterError(Exception):
    """Base class of every error hetcluster raises on purpose."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} To fix: {hint}" if hint else message)


class ConfigError(HetclusterError):
    """A configuration, inventory, catalog or command-line value is invalid."""


class CredentialsError(HetclusterError):
    """TLS or token material is missing, unreadable or inconsistent."""


class PowerSourceError(HetclusterError):
    """A power source cannot be read (missing, unreadable, charging, ...)."""


class AgentError(HetclusterError):
    """An agent cannot be reached or refused a request."""


class TaskError(HetclusterError):
    """A TensorFlow server task could not be started, stopped or found."""


class EmulationError(HetclusterError):
    """The emulated cluster cannot be started, inspected or stopped."""


class ProfileError(HetclusterError):
    """A pre-training profile is missing, malformed or could not be produced."""


class PlanningError(HetclusterError):
    """The planner got inconsistent input."""


class InfeasibleError(PlanningError):
    """No configuration satisfies the constraints."""


class MemoryPlanError(HetclusterError):
    """A memory plan cannot be built for the model or budget."""


class TrainingError(HetclusterError):
    """Training on the chosen configuration failed."""
