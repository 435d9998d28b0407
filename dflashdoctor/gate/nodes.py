"""The gate on every node of a cluster at once, over ssh, and the one report that comes of it.

Each node runs the gate as `gate --ssh NODE` would (every probe on that node, judged against the
same budgets), a bounded number of nodes at a time. A node that cannot be reached, or whose
interpreter cannot run the probes, is a finding of its own and the others still report; progress is
one line per node on stderr as each finishes. The report holds a section comparing the nodes
(judges/nodes.py), then every node's own sections, named by the node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from dflashdoctor.errors import BadInput
from dflashdoctor.gate.hostfile import Node
from dflashdoctor.judges.nodes import NodeOutcome, judge
from dflashdoctor.report import Report
from dflashdoctor.safe_text import encodable, without_controls
from dflashdoctor.session import finish, new_report

NODES_IN_FLIGHT = 8  # nodes gated at once: each runs every probe over its own ssh sessions
_SSH_FAILURE = re.compile(r"^--ssh \S+?: ")  # remote.py's words for ssh itself failing


def _outcome(node: Node, gate_one: Callable[[Node], Report]) -> NodeOutcome:
    started = time.monotonic()
    try:
        report = gate_one(node)
    except BadInput as exc:
        return NodeOutcome(node.spec, error=str(exc), duration_s=round(time.monotonic() - started, 3))
    return NodeOutcome(node.spec, report=report, duration_s=round(time.monotonic() - started, 3))


def _same_input_error_everywhere(outcomes: list[NodeOutcome]) -> str | None:
    """A usage error every node gave alike (a target no node has) is the user's input, not a node's
    fault: bad input, as on one node. ssh failing is always the node's."""
    errors = [o.error for o in outcomes]
    if any(e is None or _SSH_FAILURE.match(e) for e in errors):
        return None
    alike = {e.replace(o.name, "NODE") for e, o in zip(errors, outcomes, strict=True) if e is not None}
    return errors[0] if len(alike) == 1 else None


def gate_nodes(
    nodes: list[Node],
    gate_one: Callable[[Node], Report],
    progress: Callable[[str], None],
    in_flight: int = NODES_IN_FLIGHT,
) -> list[NodeOutcome]:
    """Every node's outcome, in the order the nodes were listed."""
    done: dict[str, NodeOutcome] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(in_flight, len(nodes)))) as pool:
        futures = [pool.submit(_outcome, node, gate_one) for node in nodes]
        for future in as_completed(futures):
            outcome = future.result()
            done[outcome.name] = outcome
            verdict = outcome.report.verdict if outcome.report is not None else "unreachable"
            line = f"dflashdoctor gate: {outcome.name}: {verdict} in {outcome.duration_s:.1f} s"
            progress(without_controls(encodable(f"{line} ({len(done)} of {len(nodes)} nodes done)")))
    outcomes = [done[node.spec] for node in nodes]
    error = _same_input_error_everywhere(outcomes)
    if error is not None:
        raise BadInput(error)
    return outcomes


def nodes_report(outcomes: list[NodeOutcome], argv: list[str], environment: dict[str, str], started: float) -> Report:
    """One report: the comparison first, then each node's sections named `NODE: probe`."""
    report = new_report("gate", argv)
    report.environment.update(environment, nodes=", ".join(o.name for o in outcomes))
    report.results.append(judge(outcomes))
    for outcome in outcomes:
        if outcome.report is None:
            continue
        for result in outcome.report.results:
            result.probe = f"{outcome.name}: {result.probe}"
            report.results.append(result)
        report.observations[outcome.name] = outcome.report.observations
    return finish(report, started)
