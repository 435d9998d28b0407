"""The console entry (`dflashdoctor`, `python -m dflashdoctor`): the doctor's own bytecode settled
first (bytecode.keep_own_bytecode), then the CLI, whose imports are most of a command's start."""

from __future__ import annotations

from dflashdoctor.bytecode import keep_own_bytecode


def main() -> None:
    keep_own_bytecode()
    from dflashdoctor.cli import main as cli_main  # after the bytecode is settled: see above

    cli_main()
