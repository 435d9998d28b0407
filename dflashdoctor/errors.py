"""Doctor-side errors with a meaning for the exit code."""


class BadInput(Exception):
    """Bad usage or bad input: the CLI prints the message as one line and exits 2."""


class MissingPackage(BadInput):
    """The probed interpreter lacks a package the probe needs (`package`)."""

    def __init__(self, package: str, message: str) -> None:
        super().__init__(message)
        self.package = package
