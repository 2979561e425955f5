"""One exception root with a fixed exit code per class.

Every message is one line that says what failed and how to fix it; the CLI prints it
without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from stackpin.untrusted import shown

MAX_MESSAGE = 4000


class StackpinError(Exception):
    """Root of every error stackpin raises on purpose."""

    return_code = 1
    kind = "error"

    def __init__(self, message: str, *, details: Sequence[str] = ()) -> None:
        # Messages quote names from outside (files, cells, members): escaped here, once,
        # so no error can print a second line, whoever raises it.
        message = shown(message, limit=MAX_MESSAGE)
        super().__init__(message)
        self.message = message
        self.details = tuple(shown(line, limit=MAX_MESSAGE) for line in details)


class ConfigurationError(StackpinError):
    """A matrix, a cell id or an option is malformed or unknown."""

    return_code = 3
    kind = "configuration"


class ValidationError(StackpinError):
    """The pinned combination is inconsistent (wheel tags, vendor labels, constraints)."""

    return_code = 4
    kind = "validation"


class LockMissingError(ValidationError):
    """The cell has no lock, so nothing says what its image installs."""

    def __init__(self, cell_id: str) -> None:
        super().__init__(f"{cell_id} has no lock: run 'stackpin wheels fetch {cell_id}' first")


class LockStaleError(ValidationError):
    """The cell's lock no longer describes it (a pin changed after the lock was written)."""

    def __init__(self, cell_id: str, reason: str) -> None:
        super().__init__(
            f"{cell_id}: lock is stale ({reason}); run 'stackpin wheels fetch {cell_id}' "
            "to re-lock, then build again"
        )


class BuildError(StackpinError):
    """An image build failed; carries the failing step and the saved log like docker-py's."""

    return_code = 5
    kind = "build"

    def __init__(
        self, message: str, *, step: str = "", log_path: str = "", details: Sequence[str] = ()
    ) -> None:
        super().__init__(message, details=details)
        self.step = step
        self.log_path = log_path


class VerificationError(StackpinError):
    """A required verification check failed, or a report could not be read."""

    return_code = 6
    kind = "verification"


class BundleError(StackpinError):
    """A bundle could not be written, or is damaged, tampered with or incomplete."""

    return_code = 7
    kind = "bundle"


class HostEnvironmentError(StackpinError):
    """Something on this host is missing: Docker daemon, mmdebstrap, zstd, a wheel file."""

    return_code = 8
    kind = "environment"


EXIT_INTERRUPTED = 130

ALL_ERRORS: tuple[type[StackpinError], ...] = (
    StackpinError,
    ConfigurationError,
    ValidationError,
    LockMissingError,
    LockStaleError,
    BuildError,
    VerificationError,
    BundleError,
    HostEnvironmentError,
)
