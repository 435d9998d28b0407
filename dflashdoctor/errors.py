"""Errors with a meaning for the exit code, on both sides: a probe sends them to the doctor in its
document, and the doctor raises them again. Standard library only (the probed side imports it)."""


class BadInput(Exception):
    """Bad usage or bad input: the CLI prints the message as one line and exits 2."""


class MissingPackage(BadInput):
    """The probed interpreter lacks a package the probe needs (`package`). Asked for directly, that is
    bad input; in the gate, it means the probe does not apply there (no triton: no autotuner to race)."""

    def __init__(self, package: str, message: str) -> None:
        super().__init__(message)
        self.package = package
