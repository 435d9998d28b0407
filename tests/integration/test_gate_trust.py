"""Whose code the gate runs, as root, where another local user (nobody, through setpriv) was first: a
configuration planted in a shared or group-writable folder, root's own configuration in a folder
others can write, a target file and a script another user owns, a `torch.py` planted in the
current folder of a probe, and the opt-in (`--trust`, `trust = [...]`) that runs them anyway. What
is refused is refused before anything runs: those run the gate in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import as_nobody, run_cli, run_main_here

OWNED = 'run = "sh -c \\"id > owned\\""\nprobes = ["env"]\n'
ENV_ONLY = 'probes = ["env"]\n'


@pytest.fixture(autouse=True)
def _as_root():
    if os.geteuid() != 0:
        pytest.skip("another local user's files need root to make (setpriv to nobody)")


def _refused(run: subprocess.CompletedProcess[str], *words: str) -> None:
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_a_configuration_another_user_planted_in_a_shared_folder_runs_nothing(tmp_path, shared):
    """The issue's attack: nobody plants a pyproject.toml whose `run` writes `id`; root's gate there."""
    folder = shared / "team"
    folder.mkdir()
    folder.chmod(0o1777)
    as_nobody(f"printf '[tool.dflashdoctor]\\n{OWNED}' > {folder}/pyproject.toml")
    done = run_main_here(folder, ["gate", "--report-dir", str(tmp_path / "report")])
    _refused(done, f"{folder}/pyproject.toml", "nobody (uid 65534)", "--trust")
    assert not (folder / "owned").exists()
    assert not (tmp_path / "report").exists()


def test_a_configuration_in_a_group_writable_folder_is_refused_whoever_wrote_it(tmp_path):
    """A folder of the group nogroup (nobody's own group, which is not root's private one): anyone in
    it could replace root's file. Root's own dflashdoctor.toml there is refused too."""
    folder = tmp_path / "group"
    folder.mkdir()
    os.chown(folder, 0, 65534)
    folder.chmod(0o775)
    (folder / "dflashdoctor.toml").write_text(OWNED)
    done = run_main_here(folder, ["gate", "--report-dir", str(tmp_path / "report")])
    _refused(done, "dflashdoctor.toml", str(folder), "can be written by the group")
    assert not (folder / "owned").exists()


def test_roots_configuration_in_a_folder_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    (folder / "dflashdoctor.toml").write_text(ENV_ONLY)
    done = run_main_here(folder, ["gate", "--report-dir", str(tmp_path / "report")])
    _refused(done, "can be written by everyone (mode 777, not sticky)")


def test_an_explicit_config_another_user_owns_is_refused_too(tmp_path, shared):
    as_nobody(f"printf '{OWNED}' > {shared}/theirs.toml")
    done = run_main_here(
        tmp_path, ["gate", "--config", str(shared / "theirs.toml"), "--report-dir", str(tmp_path / "r")]
    )
    _refused(done, "theirs.toml", "nobody (uid 65534)")
    assert not (tmp_path / "owned").exists()


def test_a_target_file_or_a_script_another_user_owns_is_refused(tmp_path, shared):
    """Root's own configuration in root's own folder, naming files nobody made: their code would run."""
    as_nobody(
        f"mkdir -m 755 {shared}/code; printf 'def attn(q, k, v):\\n    return q\\n' > {shared}/code/attn.py; "
        f"printf 'print(1)\\n' > {shared}/code/step.py"
    )
    (tmp_path / "dflashdoctor.toml").write_text(f'target = "{shared}/code/attn.py:attn"\nprobes = ["check-compile"]\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "the target's file", f"{shared}/code", "nobody (uid 65534)")
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["trace-attention"]\n')
    done = run_main_here(tmp_path, ["gate", "--script", f"{shared}/code/step.py", "--report-dir", str(tmp_path / "r")])
    _refused(done, "the script", "nobody (uid 65534)")


def test_a_module_target_found_in_the_current_folder_is_checked_file_by_file(tmp_path):
    """`pkg.attn:fn` resolves from the current folder: a package folder others can write lets them add
    the module, so it is refused though every file in it is root's."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "attn.py").write_text("def fn(q, k, v):\n    return q\n")
    (tmp_path / "pkg").chmod(0o777)
    (tmp_path / "dflashdoctor.toml").write_text('target = "pkg.attn:fn"\nprobes = ["check-compile"]\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "it holds pkg, which can be written by everyone")


def test_run_is_refused_in_a_current_folder_anyone_can_add_a_module_to(tmp_path, shared):
    """Root's own configuration, root's own sticky folder: `python -m` there would import a planted
    module by name, so `run` is refused there; `--trust` that folder runs it."""
    folder = shared / "sticky"
    folder.mkdir()
    folder.chmod(0o1777)
    (folder / "dflashdoctor.toml").write_text(OWNED)
    done = run_main_here(folder, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "the folder the `run` command starts in", "can be written by everyone")
    assert not (folder / "owned").exists()


def test_trust_runs_another_users_configuration_and_the_report_names_it_and_its_owner(tmp_path, shared):
    """The opt-in: `--trust FOLDER` runs nobody's configuration; the report says whose it was."""
    folder = shared / "team"
    folder.mkdir()
    folder.chmod(0o1777)
    as_nobody(f"printf '[tool.dflashdoctor]\\n{OWNED}' > {folder}/pyproject.toml")
    report = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "gate", "--trust", str(folder), "--report-dir", str(report), "--json"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    environment = json.loads(run.stdout)["environment"]
    assert environment["gate_config"] == str(folder / "pyproject.toml")
    assert environment["gate_config_owner"] == "nobody (uid 65534)"
    assert (folder / "owned").read_text().startswith("uid=0(root)")  # it ran: the user said so


def test_a_trust_list_in_roots_own_configuration_vouches_for_a_teammates_script(tmp_path, shared):
    as_nobody(f"mkdir -m 755 {shared}/team; printf 'x = 1\\n' > {shared}/team/step.py")
    config = tmp_path / "dflashdoctor.toml"
    config.write_text(f'probes = ["env"]\nscript = "{shared}/team/step.py"\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "the script")
    config.write_text(config.read_text() + f'trust = ["{shared}/team"]\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r2")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_a_torch_py_planted_in_the_current_folder_is_not_imported_by_a_probe(tmp_path, shared):
    """`cd /tmp/shared && dflashdoctor env` as root: the current folder was first on every probe's
    path, so nobody's `torch.py` there ran as root. Now that folder is left off the path."""
    folder = shared / "work"
    folder.mkdir()
    folder.chmod(0o1777)
    marker = shared / "imported"
    as_nobody(f'printf \'open("{marker}", "w").write("ran")\\nraise SystemExit(9)\\n\' > {folder}/torch.py')
    run = run_cli(folder, "env", timeout=300)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert not marker.exists()


def test_a_module_target_in_a_folder_left_off_the_path_says_why(tmp_path, shared):
    folder = shared / "work"
    folder.mkdir()
    folder.chmod(0o1777)
    (folder / "attn.py").write_text("def fn(q, k, v):\n    return q\n")
    run = run_cli(folder, "check-compile", "attn:fn", timeout=300)
    assert run.code == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "no module named 'attn'" in run.stderr and "not on the probe's path" in run.stderr, run.stderr


def test_a_config_with_both_top_level_keys_and_a_tool_table_is_refused(tmp_path):
    config = tmp_path / "both.toml"
    config.write_text('probes = ["env"]\n\n[tool.dflashdoctor]\nprobes = ["cache"]\n')
    done = run_main_here(tmp_path, ["gate", "--config", str(config), "--report-dir", str(tmp_path / "r")])
    _refused(done, "both [tool.dflashdoctor] and top-level keys (probes)")


# --- found by the hostile pass after the first fixes ---


def test_a_script_the_run_line_names_that_another_user_owns_is_refused(tmp_path, shared):
    """Root's own folder and configuration, but `run = "python3 train.py"` where train.py is nobody's
    (a tarball unpacked as root keeps its owners), or a script in nobody's folder by absolute path."""
    marker = tmp_path / "ran"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    os.chown(tmp_path / "train.py", 65534, 65534)
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\nrun = "python3 train.py --steps 2"\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "train.py", "nobody (uid 65534)")
    as_nobody(f"mkdir -m 755 {shared}/tools; printf 'print(1)\\n' > {shared}/tools/x.py")
    os.chown(tmp_path / "train.py", 0, 0)
    (tmp_path / "dflashdoctor.toml").write_text(f'probes = ["env"]\nrun = "python3 {shared}/tools/x.py"\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "a file the `run` command runs", "nobody (uid 65534)")
    assert not marker.exists()


def test_a_module_another_user_owns_in_the_current_folder_is_neither_imported_nor_run(tmp_path):
    """Root's own 755 folder holding nobody's torch.py: the folder's mode is fine, its module is not.
    A probe leaves the folder off its path; `run` there is refused."""
    marker = tmp_path / "imported"
    (tmp_path / "torch.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    os.chown(tmp_path / "torch.py", 65534, 65534)
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(tmp_path / "r"), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and not marker.exists(), done.stderr[-2000:]
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\nrun = "python3 -c pass"\n')
    refused = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r2")])
    _refused(refused, "it holds torch.py, which belongs to nobody (uid 65534)")
    # the next variant: root's own link there, to a module nobody owns, is nobody's code all the same
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "torch.py").rename(theirs / "helper.py")
    (tmp_path / "helper.py").symlink_to(theirs / "helper.py")
    refused = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r3")])
    _refused(refused, "it holds helper.py, which belongs to nobody (uid 65534)")


def test_trusting_another_users_link_does_not_trust_where_it_points(tmp_path, shared):
    """nobody's `root -> /` link given to --trust: trusting it must not trust all of /."""
    as_nobody(
        f"mkdir -m 755 {shared}/nob {shared}/nob/cfg; ln -s / {shared}/nob/root; "
        f"printf 'probes = [\"env\"]\\n' > {shared}/nob/cfg/c.toml"
    )
    done = run_main_here(
        tmp_path,
        [
            "gate",
            "--config",
            f"{shared}/nob/cfg/c.toml",
            "--trust",
            f"{shared}/nob/root",
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    _refused(done, "c.toml", "nobody (uid 65534)")
    empty = run_main_here(tmp_path, ["gate", "--trust", "", "--report-dir", str(tmp_path / "r")])
    _refused(empty, "an empty path names nothing")


@pytest.mark.parametrize("run", ["python3 -m tools.train", "python3 -mtools.train"])
def test_a_module_run_with_dash_m_is_checked_below_the_top_of_the_folder(tmp_path, run):
    """Root's own package folder, nobody's module in it: the current folder's top is fine, the module
    `-m` runs is not."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "train.py").write_text("print('ran')\n")
    os.chown(tmp_path / "tools" / "train.py", 65534, 65534)
    (tmp_path / "dflashdoctor.toml").write_text(f'probes = ["env"]\nrun = "{run}"\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r")])
    _refused(done, "what `run` runs with -m", "train.py, which belongs to nobody (uid 65534)")
