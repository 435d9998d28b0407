"""Report folders written as root where another local user (nobody, through setpriv) was first: links
planted at the report's names and at the temporary names the next pids would use, a report folder
that is a link or nobody's own, the default `./reports` linked away in a shared working folder, and
an agent's event log name planted before the process that would write it starts. The doctor writes
the report in its own process: these run it in this one (run_main_here), as root; the report shown
to a full disk is a real child process, whose stdout is /dev/full.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dflashdoctor.report_folder import open_append
from tests.conftest import as_nobody, run_main_here

CACHE_CHECK = ("cache", "check")


def _doctor(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process, in `cwd`, with only the arguments given (no --report-dir added)."""
    return run_main_here(cwd, args)


def _caches(tmp_path: Path) -> tuple[str, ...]:
    inductor, triton = tmp_path / "inductor", tmp_path / "triton"
    inductor.mkdir(exist_ok=True)
    triton.mkdir(exist_ok=True)
    return ("--inductor-dir", str(inductor), "--triton-dir", str(triton))


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only" / "authorized_keys"
    secret.parent.mkdir(mode=0o700)
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    return secret


def test_links_planted_at_the_report_names_and_the_next_temporary_names_are_replaced(tmp_path, shared):
    """The attack from the issue: in a shared (sticky) report folder nobody plants links at every
    report file's name and at `.<name>.<pid>.tmp` for the next pids, pointing at a root-only file."""
    secret = _secret(tmp_path)
    folder = shared / "team-reports"
    folder.mkdir()
    folder.chmod(0o1777)
    names = ["report.json", "report.html", "report.md", "junit.xml", "report.sarif", "observations.json"]
    pid = os.getpid()
    planted = [f".{name}.{p}.tmp" for name in names for p in range(pid, pid + 200)]
    as_nobody("; ".join(f"ln -s {secret} {folder}/{name}" for name in [*names, *planted[:400]]))
    run = _doctor(tmp_path, *CACHE_CHECK, *_caches(tmp_path), "--report-dir", str(folder))
    assert run.returncode == 0, run.stdout + run.stderr
    assert secret.read_text() == "root's own\n"
    for name in names:
        written = folder / name
        assert written.is_file() and not written.is_symlink(), name
        assert written.stat().st_uid == 0
    assert stat.S_IMODE((folder / "observations.json").stat().st_mode) == 0o600
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_a_report_folder_that_is_a_link_or_another_users_is_refused(tmp_path, shared):
    as_nobody(f"mkdir -m 755 {shared}/theirs; ln -s {shared}/theirs {shared}/linked")
    for folder, why in ((shared / "linked", "symbolic link"), (shared / "theirs", "owned by nobody (uid 65534)")):
        run = _doctor(tmp_path, *CACHE_CHECK, *_caches(tmp_path), "--report-dir", str(folder))
        assert run.returncode == 2, run.stdout + run.stderr
        assert why in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert list((shared / "theirs").iterdir()) == []


def test_a_folder_others_can_write_without_the_sticky_bit_is_refused(tmp_path, shared):
    folder = shared / "loose"
    folder.mkdir()
    folder.chmod(0o777)
    run = _doctor(tmp_path, *CACHE_CHECK, *_caches(tmp_path), "--report-dir", str(folder))
    assert run.returncode == 2 and "without the sticky bit" in run.stderr, run.stdout + run.stderr
    assert list(folder.iterdir()) == []


def test_the_default_reports_folder_linked_away_in_a_shared_working_folder_is_refused(tmp_path, shared):
    """nobody links `reports` in a shared working folder to a folder of theirs: root's report (with
    its environment) would land where nobody reads it."""
    work = shared / "work"
    work.mkdir()
    work.chmod(0o1777)
    as_nobody(f"mkdir -m 777 {shared}/drop; ln -s {shared}/drop {work}/reports")
    run = _doctor(work, *CACHE_CHECK, *_caches(tmp_path))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "symbolic link" in run.stderr and "Traceback" not in run.stderr
    assert list((shared / "drop").iterdir()) == []


def test_an_event_log_name_planted_before_the_process_starts_is_never_written_through(tmp_path, shared):
    secret = _secret(tmp_path)
    as_nobody(f"ln -s {secret} {shared}/host-1.jsonl; mkfifo {shared}/host-2.jsonl; echo x > {shared}/host-3.jsonl")
    for name in ("host-1.jsonl", "host-2.jsonl", "host-3.jsonl"):
        with pytest.raises(OSError):
            open_append(str(shared / name))
    os.link(secret, tmp_path / "second-name")  # one of root's files, with another name elsewhere
    with pytest.raises(OSError):
        open_append(str(secret))
    assert secret.read_text() == "root's own\n"
    own = tmp_path / "host-4.jsonl"
    for line in (b"one\n", b"two\n"):  # a process that exec'd itself appends to its own log
        fd = open_append(str(own))
        os.write(fd, line)
        os.close(fd)
    assert own.read_bytes() == b"one\ntwo\n" and stat.S_IMODE(own.stat().st_mode) == 0o600


def test_a_report_folder_that_is_a_fifo_or_a_device_is_named_as_such(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for given, words in ((tmp_path / "fifo", "is a FIFO, not a folder"), (Path("/dev/zero"), "character device")):
        run = _doctor(tmp_path, *CACHE_CHECK, *_caches(tmp_path), "--report-dir", str(given))
        assert run.returncode == 2 and words in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_report_folder_that_cannot_be_written_still_gives_the_json_report(tmp_path, capsys):
    """--json: the report reaches stdout first; a folder that fills up or is replaced afterwards is
    one line and exit 2, not a lost report."""
    import json

    from dflashdoctor.errors import BadInput
    from dflashdoctor.output import emit
    from dflashdoctor.report import Report

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    report = Report(command="cache", argv=["dflashdoctor", "cache", "check"], started="now")
    with pytest.raises(BadInput, match="cannot"):
        emit(report, json_output=True, report_dir=blocked / "report", verbose=False)
    assert json.loads(capsys.readouterr().out)["command"] == "cache"


def test_show_to_a_full_disk_is_one_line_and_exit_2(tmp_path):
    example = Path(__file__).resolve().parents[2] / "reports" / "examples" / "h200-healthy" / "report.json"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "dflashdoctor", "show", str(example)], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 2 and done.stderr == "dflashdoctor: cannot write the output: No space left on device\n"
