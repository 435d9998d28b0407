"""The doctor side of `dflashdoctor run`: start the command with the agent on PYTHONPATH, watch it
(progress, hangs, Ctrl-C), then read back every process's events."""
