"""`python -m dflashdoctor` runs the CLI."""

from dflashdoctor.cli import main

main()
