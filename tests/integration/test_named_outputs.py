"""Where a report copy (`--junit`, `--sarif`) and a report folder go, as root, with devices, FIFOs,
descriptors and other users' links on the way: `/dev/null` stays a device and `/dev/stdout` a link,
`-` is stdout, a FIFO with a reader is written as a stream, and what is neither a regular file nor a
stream is refused (exit 2) before anything runs; a link another user planted on the way is never
followed; one --report-dir serves one running command. `lint` writes the copies here: it is the
quickest command that writes a SARIF copy."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflashdoctor.report_folder import held
from tests.conftest import as_nobody, run_main_here

RAW = """from torch.nn.attention.flex_attention import flex_attention


def f(q, k, v):
    return flex_attention(q, k, v)
"""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "attn.py"
    path.write_text(RAW)
    return path


def _doctor(*args: str, cwd: Path, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """The CLI as a child process: what it writes to its own descriptors is the point here."""
    return subprocess.run(
        [sys.executable, "-m", "dflashdoctor", *args],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


def _one_line_refusal(run: subprocess.CompletedProcess[str], *words: str) -> None:
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    for word in words:
        assert word in run.stderr, run.stderr


def test_junit_to_dev_null_leaves_dev_null_a_device(tmp_path, source):
    before = os.stat("/dev/null")
    run = _doctor("lint", str(source), "--sarif", "/dev/null", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert (tmp_path / "r" / "report.sarif").is_file()  # the folder's own copy, as always


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/proc/self/fd/1"])
def test_sarif_to_stdout_is_the_sarif_alone_and_the_terminal_report_goes_to_stderr(tmp_path, source, name):
    link = os.readlink("/dev/stdout")
    run = _doctor("lint", str(source), "--sarif", name, "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    sarif = json.loads(run.stdout)
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"][0]["ruleId"] == "lint-raw-flex-call"
    assert "DFD001 flex_attention is called raw" in run.stderr  # lint's own lines, on stderr
    assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == link


@pytest.mark.parametrize(
    "name",
    ["/dev/stdout", "two-links.sarif", "/proc/self/fd/../fd/1", "/dev/fd/../fd/1", "/proc/self/fd/../../self/fd/1"],
)
def test_sarif_to_stdout_redirected_to_a_file_appends_where_stdout_stands(tmp_path, source, name):
    """`dflashdoctor ... --sarif /dev/stdout >> ci.log`: the SARIF lands in ci.log after what was
    written there before, never renamed over it, by any spelling (a link to a link to /dev/stdout,
    or a path through /proc that is no literal /dev/stdout, replaced ci.log before)."""
    (tmp_path / "one-link.sarif").symlink_to("/dev/stdout")
    (tmp_path / "two-links.sarif").symlink_to("one-link.sarif")
    log = tmp_path / "out.log"
    log.write_text("before\n")
    with open(log, "a") as handle:
        run = _doctor(
            "lint", str(source), "--sarif", name, "--report-dir", str(tmp_path / "r"), cwd=tmp_path, stdout=handle
        )
    assert run.returncode == 1, run.stderr
    text = log.read_text()
    assert text.startswith("before\n") and json.loads(text.removeprefix("before\n"))["version"] == "2.1.0"


def test_json_and_a_copy_on_stdout_together_are_refused_before_anything_runs(tmp_path, source):
    run = _doctor("lint", str(source), "--sarif", "-", "--json", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    _one_line_refusal(run, "--sarif -", "--json", "stdout")
    assert run.stdout == "" and not (tmp_path / "r").exists()


def test_a_fifo_with_a_reader_is_written_as_a_stream_and_one_without_is_refused(tmp_path, source):
    fifo = tmp_path / "sarif.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as handle:  # opening blocks until the doctor opens it to write
            received.append(handle.read())

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    run = _doctor("lint", str(source), "--sarif", str(fifo), "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    reader.join(timeout=60)
    assert run.returncode == 1, run.stderr
    assert json.loads(received[0])["version"] == "2.1.0"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    lonely = tmp_path / "nobody-reads.fifo"
    os.mkfifo(lonely)
    run = _doctor("lint", str(source), "--sarif", str(lonely), "--report-dir", str(tmp_path / "r2"), cwd=tmp_path)
    _one_line_refusal(run, "FIFO nobody reads")
    assert stat.S_ISFIFO(os.lstat(lonely).st_mode)


def test_what_is_neither_a_file_nor_a_stream_is_refused_and_left_as_it_was(tmp_path, source):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "a.sock"))
    try:
        for path, words in ((folder, "is a folder"), (tmp_path / "a.sock", "is a socket")):
            run = run_main_here(
                tmp_path, ["lint", str(source), "--sarif", str(path), "--report-dir", str(tmp_path / "r")]
            )
            _one_line_refusal(run, words)
        assert stat.S_ISSOCK(os.lstat(tmp_path / "a.sock").st_mode) and folder.is_dir()
    finally:
        sock.close()


def _secret_folder(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    return secret


def test_a_link_another_user_planted_at_the_copys_name_is_refused_not_followed(tmp_path, shared, source):
    secret = _secret_folder(tmp_path)
    (secret / "keys").write_text("root's own\n")
    as_nobody(f"ln -s {secret}/keys {shared}/out.sarif; mkfifo {shared}/their.fifo")
    run = run_main_here(
        tmp_path, ["lint", str(source), "--sarif", str(shared / "out.sarif"), "--report-dir", str(tmp_path / "r")]
    )
    _one_line_refusal(run, "a link made by nobody (uid 65534), never followed")
    assert (secret / "keys").read_text() == "root's own\n" and os.path.islink(shared / "out.sarif")
    run = run_main_here(
        tmp_path, ["lint", str(source), "--sarif", str(shared / "their.fifo"), "--report-dir", str(tmp_path / "r")]
    )
    _one_line_refusal(run, "a FIFO of nobody (uid 65534)")


def test_a_folder_link_another_user_planted_on_the_way_is_never_followed(tmp_path, shared, source):
    """`--sarif /shared/ci/out.sarif` and `--report-dir /shared/ci/report` where nobody made `ci` a
    link to a folder of root's: nothing is written there, for either."""
    secret = _secret_folder(tmp_path)
    as_nobody(f"ln -s {secret} {shared}/ci")
    for args, what in (
        (["--sarif", str(shared / "ci" / "out.sarif"), "--report-dir", str(tmp_path / "r")], "--sarif"),
        (["--report-dir", str(shared / "ci" / "report")], "--report-dir"),
    ):
        run = run_main_here(tmp_path, ["lint", str(source), *args])
        _one_line_refusal(run, f"{shared}/ci is a link made by nobody (uid 65534), never followed")
        assert list(secret.iterdir()) == [], what


def test_a_link_of_roots_own_on_the_way_is_the_users_setup_and_is_followed(tmp_path, source):
    (tmp_path / "real").mkdir()
    (tmp_path / "ci").symlink_to(tmp_path / "real")
    run = run_main_here(tmp_path, ["lint", str(source), "--sarif", "ci/out.sarif", "--report-dir", "ci/report"])
    assert run.returncode == 1, run.stderr
    assert json.loads((tmp_path / "real" / "out.sarif").read_text())["version"] == "2.1.0"
    assert (tmp_path / "real" / "report" / "report.json").is_file()


def test_a_second_command_given_a_report_folder_still_in_use_is_refused(tmp_path):
    """Two gates into one --report-dir: the second would write its files over the first's as it
    finished. The first holds the folder while it runs; the second is refused before it probes."""
    (tmp_path / "dflashdoctor.toml").write_text(
        'probes = ["env"]\nrun = "python3 -c \\"import time; time.sleep(20)\\""\n'
    )
    report = tmp_path / "report"
    first = subprocess.Popen(
        [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(report)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = run_main_here(tmp_path, ["gate", "--report-dir", str(report)])
        _one_line_refusal(second, "another dflashdoctor still running")
    finally:
        first.terminate()
        first.wait(timeout=120)
    later = run_main_here(tmp_path, ["lint", str(tmp_path), "--report-dir", str(report)])
    assert later.returncode in (0, 1), later.stderr  # once the first has ended, the folder is free again


def test_an_empty_report_dir_is_refused_not_taken_for_the_current_folder(tmp_path, source):
    """`--report-dir "$OUT"` with OUT unset: Path("") is ".", and the report replaced the user's own
    report.md and junit.xml in the current folder."""
    (tmp_path / "report.md").write_text("mine\n")
    run = run_main_here(tmp_path, ["lint", str(source), "--report-dir", ""])
    _one_line_refusal(run, "an empty path names nothing")
    assert (tmp_path / "report.md").read_text() == "mine\n"


@pytest.mark.parametrize("folder", ["/proc/self/fd", "/sys/kernel", "/sys/kernel/not/made"])
@pytest.mark.parametrize("option", ["--report-dir", "--sarif"])
def test_a_place_nothing_can_be_made_in_is_refused_before_anything_runs(tmp_path, source, folder, option):
    """Root's permission bits say yes on /proc and /sys: the check makes a file there to know, for a
    report folder and for a copy's folder alike."""
    if option == "--report-dir":
        args = ["--report-dir", folder]
    else:
        args = ["--sarif", f"{folder}/out.sarif", "--report-dir", str(tmp_path / "r")]
    run = run_main_here(tmp_path, ["lint", str(source), *args])
    _one_line_refusal(run, "cannot be written by this user")


def test_an_empty_folder_made_for_a_stopped_command_is_removed_only_if_still_the_one_made(tmp_path, shared):
    """held() removes the report folder it made when the command stops before its report. Through a
    folder nobody owns, nobody swapped the way to it for a link to root's own folder: root's was
    removed. Now the removal goes through the parent reached again without nobody's links."""
    as_nobody(f"mkdir -m 755 {shared}/nobp {shared}/nobp/mid")
    victim = tmp_path / "victim"
    (victim / "rep").mkdir(parents=True)
    target = shared / "nobp" / "mid" / "rep"
    with pytest.raises(RuntimeError), held(target):
        as_nobody(f"mv {shared}/nobp/mid {shared}/nobp/mid.old; ln -s {victim} {shared}/nobp/mid")
        raise RuntimeError("stopped before its report")
    assert (victim / "rep").is_dir()
    assert (shared / "nobp" / "mid.old" / "rep").is_dir()  # the one made, left where nobody moved it
