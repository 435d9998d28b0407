"""Doctor-side errors with a meaning for the exit code."""


class BadInput(Exception):
    """Bad usage or bad input: the CLI prints the message as one line and exits 2."""
