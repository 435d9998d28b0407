"""Real sshd servers on loopback for the tests: each a "node" with an environment of its own.

`start_sshd` runs one key-only sshd for the current user; `SetEnv` lines give the sessions it
serves their own variables (a node whose caches live elsewhere). A test talks to them with the
system's ssh client, through the options or the ssh config these helpers write.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
HAVE_SSH = SSHD is not None and shutil.which("ssh") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user() -> str:
    return os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()


def client_key(home: Path) -> Path:
    """One key pair for every server of a test: the client key, authorised by each."""
    key = home / "client_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


@dataclass
class Sshd:
    port: int
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_sshd(home: Path, key: Path, environment: dict[str, str] | None = None) -> Sshd:
    """A key-only sshd on 127.0.0.1 for the current user, its sessions given `environment`."""
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_key")], check=True)
    shutil.copy(f"{key}.pub", home / "authorized_keys")
    port = free_port()
    # one SetEnv line: sshd takes the first value of a keyword and ignores later lines
    pairs = " ".join(f"{name}={value}" for name, value in (environment or {}).items())
    set_env = f"SetEnv {pairs}\n" if pairs else ""
    (home / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {home / 'host_key'}\n"
        f"AuthorizedKeysFile {home / 'authorized_keys'}\nPidFile {home / 'sshd.pid'}\nStrictModes no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        f"PermitRootLogin prohibit-password\nUsePAM no\nSubsystem sftp internal-sftp\n{set_env}"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(home / "sshd_config")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return Sshd(port, server)
        if server.poll() is not None:
            pytest.skip(f"sshd did not start: {server.stderr.read().decode()[-500:]}")
        time.sleep(0.1)
    server.kill()
    pytest.skip("sshd did not listen within 10 s")


def client_options(home: Path, key: Path) -> str:
    """DFLASHDOCTOR_SSH_OPTIONS for a server started here: this key, a known-hosts file of the test's."""
    return (
        f"-F /dev/null -i {key} -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new "
        f"-o UserKnownHostsFile={home / 'known_hosts'}"
    )


def ssh_config(home: Path, key: Path, hosts: dict[str, int]) -> Path:
    """An ssh config naming each server as a host (`Host node-a` on its port), as a cluster's has."""
    blocks = "".join(
        f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user()}\n  IdentityFile {key}\n"
        f"  IdentitiesOnly yes\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile {home / 'known_hosts'}\n"
        for name, port in hosts.items()
    )
    path = home / "ssh_config"
    path.write_text(blocks)
    return path
