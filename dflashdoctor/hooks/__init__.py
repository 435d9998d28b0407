"""Instrumentation installed inside the probed process (standard library and torch only)."""
