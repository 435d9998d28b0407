"""The probed side of `dflashdoctor run`: instrumentation that loads itself into every Python process
a command starts (through `bootstrap/sitecustomize.py` on PYTHONPATH) and writes JSON-lines events
for the doctor to merge. Standard library only until torch, triton or transformers are imported by
the program itself; nothing here imports them first.
"""
