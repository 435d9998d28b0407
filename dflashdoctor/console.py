"""The console entry (`dflashdoctor`, `python -m dflashdoctor`): the doctor's own bytecode settled
first (bytecode.keep_own_bytecode), then the CLI, whose imports are most of a command's start."""

from __future__ import annotations

import os
from typing import NoReturn

from dflashdoctor.bytecode import keep_own_bytecode


def _standard_descriptors_open() -> None:
    """Descriptors 0, 1 and 2 held open (on /dev/null where the doctor was started without one,
    `2>&-`): else the next file opened would take that number, and what is printed to stderr would
    land in a report file. Python then has no sys.stdout or sys.stderr for one closed at its start:
    the CLI says so (cli._usable_streams)."""
    for number in (0, 1, 2):
        try:
            os.fstat(number)
        except OSError:
            fd = os.open(os.devnull, os.O_RDWR)
            if fd != number:  # a lower one was closed too and took it: the loop opens this one next
                os.dup2(fd, number)
                os.close(fd)


def main() -> NoReturn:
    _standard_descriptors_open()
    keep_own_bytecode()
    from dflashdoctor.cli import exit_process  # after the bytecode is settled: see above
    from dflashdoctor.cli import main as cli_main

    exit_process(cli_main())
