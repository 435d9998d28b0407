"""Every finding code in codes.py has a unit test: each unit-test module names the codes it proves
in `CASES`, and a code that none names fails here."""

from __future__ import annotations

import importlib
import pkgutil

from dflashdoctor.codes import CODES
from tests import unit


def _covered() -> dict[str, list[str]]:
    covered: dict[str, list[str]] = {}
    for module in pkgutil.iter_modules(unit.__path__):
        cases = getattr(importlib.import_module(f"tests.unit.{module.name}"), "CASES", {})
        for code in cases:
            covered.setdefault(code, []).append(module.name)
    return covered


def test_every_finding_code_has_a_unit_test():
    missing = sorted(set(CODES) - set(_covered()))
    assert not missing, f"finding codes no unit test proves: {', '.join(missing)}"


def test_no_unit_test_claims_a_code_that_does_not_exist():
    assert not set(_covered()) - set(CODES)
