"""`merge DIR`: the parts every node of a multi-node `run` wrote under DIR, as one report in DIR.

Runs nothing: each part's events and observations are read back and judged again, under the ranks
torch.distributed gave its processes (judges/run_nodes.py). The node of rank 0 calls this itself
once the others have finished (commands/run.py); calling it again merges what is there now.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.judges.run_nodes import RunPart, judge
from dflashdoctor.observations import ObservationsError
from dflashdoctor.placed_files import MIB
from dflashdoctor.report import Report
from dflashdoctor.runs.observations import RunObservations
from dflashdoctor.runs.parts import PART_FILE, FoundPart, PartRefused, SharedFolder, find_parts
from dflashdoctor.safe_fs import closing
from dflashdoctor.session import finish, new_report

_OBSERVATIONS_BYTES = 256 * MIB  # a run's with many processes is a few megabytes


def _observations(shared: SharedFolder, part: FoundPart) -> tuple[RunObservations | None, str | None]:
    """The part's observations with its events, read through its folder's descriptor (SharedFolder:
    no link followed, only its writers' files); or why it was refused."""
    if part.report is None or part.refused:
        return None, part.refused
    try:
        with closing(shared.folder(shared.fd, part.name, "folder")) as folder:
            document = json.loads(shared.read(folder, "observations.json", _OBSERVATIONS_BYTES))
            with closing(shared.folder(folder, "events", "events folder")) as events:
                data = document["probes"]["run"]
                return RunObservations.read(data, part.folder / "events", events, shared.owners), None
    except PartRefused as exc:
        return None, str(exc)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, ObservationsError):  # left unreadable
        return None, None


def merge(directory: Path, argv: list[str], parts: list[FoundPart] | None = None) -> Report:
    if not directory.is_dir():
        raise BadInput(f"{directory} is not a folder")
    try:
        shared = SharedFolder(directory)
    except OSError as exc:
        raise BadInput(f"cannot open {directory}: {exc.strerror or exc}") from None
    with shared:
        found = parts if parts is not None else find_parts(directory)
        if not found:
            raise BadInput(f"{directory} holds no node's part of a run (no */{PART_FILE}): nothing to merge")
        started = time.monotonic()
        report = new_report("merge", argv)
        runs = []
        for part in found:
            observations, refused = _observations(shared, part)
            reported = part.report is not None
            runs.append(RunPart(part.name, part.record, observations, reported=reported, refused=refused))
    report.environment.update(
        target=" ".join(str(w) for w in (found[0].record.get("command") or [])),
        nodes=", ".join(f"{p.name}" for p in found),
    )
    report.results.extend(judge(runs))
    report.observations["merge"] = {"parts": [p.name for p in found], "records": [p.record for p in found]}
    return finish(report, started)
