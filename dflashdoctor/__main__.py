"""`python -m dflashdoctor` runs the CLI."""

from dflashdoctor.console import main

main()
