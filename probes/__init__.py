"""Probe scripts: each runs inside the probed interpreter as `python probes/<name>.py`.

Installed as `dflashdoctor.probes` so the wheel carries them; the runner finds them through that
package and starts them by file path, with dflashdoctor's folder on PYTHONPATH.
"""
