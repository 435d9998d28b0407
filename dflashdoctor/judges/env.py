"""Judges the environment: what is installed, what is set, and the settings known to bite.

Values of variables that look secret arrive redacted (the probe redacts them as it reads them,
redaction.py): the env report is meant to be pasted into bug reports.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge, size_text
from dflashdoctor.judges.cache import shared_filesystem_finding, untrusted_root_finding
from dflashdoctor.judges.fla import fla_guard_finding, fla_not_usable_finding, why_fla_cannot_run
from dflashdoctor.observations import EnvObservations
from dflashdoctor.records import BytecodeRecord, FlaState, PackageBytecode
from dflashdoctor.report import Finding, ProbeResult

DEFAULT_RECOMPILE_LIMIT = 8
# below this share of a package's modules with current bytecode, its imports compile from source
# (a few modules of a big package may never compile: tests, files for other Python versions)
_CACHED_ENOUGH = 0.9

# (variable, the value that bites or None for any, why, what to do)
_HAZARDS: tuple[tuple[str, str | None, str, str], ...] = (
    (
        "TORCHDYNAMO_DISABLE",
        "1",
        "dynamo is disabled: torch.compile returns the function unchanged and flex_attention runs its dense kernel.",
        "Unset TORCHDYNAMO_DISABLE for training.",
    ),
    (
        "TORCHDYNAMO_SUPPRESS_ERRORS",
        None,
        "compile errors fall back to eager silently: a flex_attention wrapper that fails to compile runs dense.",
        "Unset it, or run `dflashdoctor check-compile` on the wrapper.",
    ),
    (
        "CUDA_LAUNCH_BLOCKING",
        "1",
        "every CUDA launch is synchronous: good for debugging, many times slower for training.",
        "Unset it for a real run.",
    ),
    (
        "TRITON_INTERPRET",
        "1",
        "triton kernels run in the Python interpreter on the CPU: orders of magnitude slower.",
        "Unset it for a real run.",
    ),
)


class EnvJudge(Judge):
    def __init__(self, observations: EnvObservations, budgets: Budgets) -> None:
        super().__init__("env", budgets)
        self.observations = observations
        self.cache_roots = observations.cache_roots

    def judge(self) -> ProbeResult:
        obs = self.observations
        packages = obs.packages
        fla = packages.get("fla-core") or packages.get("flash-linear-attention")
        cuda = f"CUDA {obs.cuda}, cuDNN {obs.cudnn}" if obs.cuda else "CPU build"
        self._check("python", "info", f"{obs.python} ({obs.executable})")
        self._check("torch", "info", f"{obs.torch} ({cuda})")
        versions = {name: packages.get(name) for name in ("triton", "transformers")} | {"fla": fla}
        self._check("libraries", "info", ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items()))
        gpus = obs.gpus
        summary = ", ".join(f"{g['name']} (sm {g['capability']}, {size_text(g['memory_bytes'])})" for g in gpus)
        self._check("gpus", "info", f"{summary}; driver {obs.driver}" if gpus else "none visible to torch")
        for root in self.cache_roots:
            size = f"{size_text(root['bytes'])} in {root['files']} files" if root["exists"] else "not created yet"
            place = f", on {root['filesystem']}" if root.get("filesystem") else ""
            self._check(f"cache {root['kind']}", "info", f"{root['path']} ({root['source']}): {size}{place}")
        variables = obs.variables
        self._hazards(variables)
        self._shared_roots()
        self._bytecode()
        self._fla(obs.fla)
        self._recompile_limit()
        self.measurements.update({k: v for k, v in asdict(obs).items() if k not in ("variables", "cache_roots")})
        self.measurements.update(variables=variables, cache_roots=self.cache_roots)
        return self.result()

    def _hazards(self, variables: dict[str, str]) -> None:
        for name, bites, why, fix in _HAZARDS:
            value = variables.get(name)
            if value is None or (bites is not None and value != bites):
                continue
            self.findings.append(
                finding(
                    "env-hazard",
                    f"{name}={value}: {why.split(':')[0]}",
                    detail=why,
                    evidence={"variable": name, "value": value},
                    fix=fix,
                )
            )
        hazards = len(self.findings)
        self._check("hazards", "warn" if hazards else "pass", f"{hazards} known hazards set", "env-hazard")
        if "TORCH_LOGS" in variables:  # not harmful, but it silences in-process logging setup
            self._check("TORCH_LOGS", "info", "set: torch._logging.set_logs() is ignored while it is")

    def _fla(self, fla: FlaState | None) -> None:
        """FLA's kernels on this machine, judged from its platform and its own guards, without running a
        model: the same findings a model trace meets."""
        if fla is None:
            return
        holding = [guard for guard in fla["guards"] if guard["applies"]]
        found = [] if fla["usable"] else [fla_not_usable_finding(fla, traced=False)]
        found += [fla_guard_finding(guard, fla, during=None) for guard in holding]
        self.findings += found
        parts = [] if fla["usable"] else [f"installed, but its kernels cannot run: {why_fla_cannot_run(fla)}"]
        if holding:
            parts.append("refuses " + ", ".join(f"`{g['function']}`" for g in holding) + " on this machine")
        summary = f"FLA {fla['version']} " + ("; ".join(parts) if parts else f"runs here (platform {fla['platform']})")
        self._check("fla kernels", "warn" if found else "pass", summary, "kernel-unavailable")

    def _shared_roots(self) -> None:
        untrusted = [(r, why) for r in self.cache_roots if (why := r["untrusted"])]
        for root, why in untrusted:
            evidence = {"root": root["path"], "source": root["source"]}
            self.findings.append(untrusted_root_finding(root["kind"], root["path"], why, evidence))
        if untrusted:
            named = ", ".join(f"{r['kind']} {r['path']}" for r, _ in untrusted)
            self._check(
                "cache trust", "fail", f"code another user could have put there: {named}", "cache-root-untrusted"
            )
        shared = [root for root in self.cache_roots if root.get("network_filesystem")]
        for root in shared:
            self.findings.append(shared_filesystem_finding(root["kind"], root["path"], root, {"root": root["path"]}))
        if shared:
            summary = f"{len(shared)} cache root{'s' if len(shared) > 1 else ''} on a network filesystem"
            self._check("cache places", "warn", summary, "cache-shared-filesystem")

    def _bytecode(self) -> None:
        state = self.observations.bytecode
        if not state or not state["packages"]:
            return
        packages = state["packages"]
        counts = ", ".join(f"{p['package']} {p['cached']}/{p['modules']}" for p in packages)
        uncached = [p for p in packages if p["modules"] and p["cached"] / p["modules"] < _CACHED_ENOUGH]
        stuck = [p for p in uncached if not p["writable"]]
        if not uncached:
            self._check("bytecode", "pass", f"compiled bytecode for the modules of {counts}")
        elif not stuck:
            self._check("bytecode", "info", f"{counts} modules compiled: the first import writes the rest")
        else:
            self.findings.append(self._bytecode_finding(state, stuck, counts))
            self._check("bytecode", "warn", f"{counts} modules compiled, and none is written", "bytecode-not-cached")

    def _bytecode_finding(self, state: BytecodeRecord, stuck: list[PackageBytecode], counts: str) -> Finding:
        names = ", ".join(p["package"] for p in stuck)
        if not state["dont_write_bytecode"]:
            why = "their folders are not writable"
        elif state["PYTHONDONTWRITEBYTECODE"]:
            why = "PYTHONDONTWRITEBYTECODE is set"
        else:
            why = "the interpreter runs with -B"
        took = self.observations.import_torch_s
        stuck_torch = any(p["package"] == "torch" for p in stuck)
        cost = f" Importing torch took {took:.1f} s in this probe." if stuck_torch and took is not None else ""
        python = self.observations.executable or "python"
        return finding(
            "bytecode-not-cached",
            f"{names}: no compiled bytecode, and none is written ({why}): every process compiles them",
            detail=(
                f"Modules with current bytecode: {counts}. Python compiles a module's source on every import that "
                f"finds no current bytecode, and {why}, so each process of a run (every rank, every Inductor "
                f"compile-worker pool, every DataLoader worker started by spawn) compiles {names} again before it "
                f"does any work.{cost}"
            ),
            evidence={"packages": stuck, **{k: v for k, v in state.items() if k != "packages"}},
            fix=(
                "Compile them once where they are installed (in the image's build step, after pip install): "
                + " && ".join(f"{shlex.quote(python)} -m compileall -q -j 0 {shlex.quote(p['path'])}" for p in stuck)
                + ". Python reads that bytecode even with PYTHONDONTWRITEBYTECODE set."
            ),
        )

    def _recompile_limit(self) -> None:
        limit = self.observations.recompile_limit
        if limit is None:
            return
        changed = limit != DEFAULT_RECOMPILE_LIMIT
        note = f"{limit}" + (f" (torch's default is {DEFAULT_RECOMPILE_LIMIT})" if changed else " (default)")
        self._check("recompile limit", "info", f"{note}: past it, dynamo runs a frame eagerly (flex runs dense)")


def judge(observations: EnvObservations, budgets: Budgets) -> list[ProbeResult]:
    return [EnvJudge(observations, budgets).judge()]
