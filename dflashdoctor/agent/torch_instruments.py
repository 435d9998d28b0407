"""Everything `run` watches inside a process once the program has imported torch.

The same recorders as trace-attention (the dense-kernel hook, the flex_attention call-site
recorder, transformers' attention interface once transformers is imported), dynamo's compile
records, triton's autotuners once triton is imported, optimizer steps with memory, and out-of-memory
forensics. `snapshot()` writes what they hold as one event, shaped like trace-attention's
observations so the doctor judges it with the same rules.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from dflashdoctor.agent.config import FINAL_SNAPSHOTS, PACKAGE_DIR
from dflashdoctor.agent.post_import import when_imported
from dflashdoctor.hooks.dynamo_watch import DynamoWatch
from dflashdoctor.hooks.flex_dense import DenseEvent, DenseFlexRecorder
from dflashdoctor.hooks.module_names import ModuleNamer
from dflashdoctor.observations import GraphBreakSite, RunSnapshot, dump, not_written
from dflashdoctor.records import TracedScript

if TYPE_CHECKING:
    from dflashdoctor.agent.process import ProcessAgent
    from dflashdoctor.hooks.flex_calls import FlexCall, FlexCallRecorder

_SNAPSHOT_EVERY_S = 10.0  # at most one snapshot this often while steps go on (and one at the end)
# Steps are written one by one at first (where a run changes most and most often fails), then at
# most one record this often, covering the steps since: a process writes so much per hour, not per
# step, for days. Dense kernels, out-of-memory, exceptions and overlaps are their own events, never
# coalesced (a dense kernel like one already on disk waits up to _DENSE_BATCH_S, to be written with others).
_EVERY_STEP = 100
_STEP_RECORD_EVERY_S = 5.0
_DENSE_LOGGED = 200  # dense kernel events logged one by one, and kept in a snapshot (the rest counted)
_DENSE_BATCH_S = 1.0
_HISTORY_ENTRIES = 50_000  # allocations kept for the snapshot: the ones before an OOM are what matter

_NOT_WRITTEN = not_written(DenseEvent)  # the event's own state, never in a written line


def _written(event: DenseEvent) -> dict[str, Any]:
    return {k: v for k, v in vars(event).items() if k not in _NOT_WRITTEN}


def _dynamo_disabled() -> bool:
    """TORCHDYNAMO_DISABLE as dynamo read it; never imports dynamo (a second of CPU) to ask."""
    if "torch._dynamo" not in sys.modules:
        return False
    try:
        return bool(torch._dynamo.config.disable)
    except AttributeError:
        return False


class _StepWindow:
    """The steps since the last step record: how many, and their wall times (between one step's end
    and the next's)."""

    __slots__ = ("count", "longest", "shortest", "total")

    def __init__(self) -> None:
        self.count, self.total, self.shortest, self.longest = 0, 0.0, float("inf"), 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.shortest = min(self.shortest, seconds)
        self.longest = max(self.longest, seconds)

    def summary(self) -> dict[str, float] | None:
        if not self.count:
            return None
        return {"mean": self.total / self.count, "min": self.shortest, "max": self.longest}


class StrictModeError(RuntimeError):
    """Raised under `run --strict` where the program would silently run flex_attention dense."""


class TorchInstruments:
    def __init__(self, agent: ProcessAgent) -> None:
        self.agent = agent
        self.log = agent.log
        self.settings = agent.settings
        self.namer = ModuleNamer()
        # skip_files: never name a frame of dflashdoctor itself as a call site
        self.dense = DenseFlexRecorder(
            skip_files=(PACKAGE_DIR,), on_event=self._dense_event, max_events=2000, namer=self.namer
        )
        self.flex: Any = None
        self.hf: Any = None
        self.guard: Any = None
        self.watch: DynamoWatch | None = None
        self.steps = 0
        self._recorded_steps = 0  # steps covered by step records written so far
        self._last_step_record = 0.0
        self._step_ended: float | None = None
        self._window = _StepWindow()
        self.dense_seen = 0
        self._dense_keys: set[tuple[Any, ...]] = set()  # (kind, file, line, layer, route) on disk already
        self._dense_pending: list[tuple[float, DenseEvent]] = []  # (time, event) not written yet
        # Kernels run on several threads (autograd's, a pair's); re-entrant for the SIGTERM handler's snapshot.
        self._dense_lock = threading.RLock()
        self.oom: dict[str, Any] | None = None
        self.unavailable: list[str] = []
        self._last_snapshot = 0.0
        self._snapshot_lock = threading.RLock()  # the SIGTERM handler may snapshot inside a snapshot

    def install(self) -> TorchInstruments:
        """What every torch process gets at once is cheap; the recorders come with what they watch,
        so a process that never uses flex_attention or dynamo (a compile worker, a data loader)
        does not import them."""
        safely = self.agent.safely
        safely("optimizer steps", self._count_steps)
        safely("cuda hooks", self._on_cuda_init)
        when_imported("torch.nn.attention.flex_attention", lambda _m: safely("flex recorders", self._record_flex))
        when_imported("torch._dynamo", lambda _m: safely("dynamo watch", self._watch_dynamo))
        when_imported("transformers.modeling_utils", lambda _m: safely("transformers recorder", self._record_hf))
        when_imported("triton.runtime.autotuner", lambda _m: safely("autotuner guard", self._guard_autotuners))
        self.log.write("instrumented", torch=torch.__version__, unavailable=self.unavailable)
        return self

    # -- what is installed -------------------------------------------------------------------
    def _record_flex(self) -> None:
        """Runs as flex_attention's module finishes executing, before any `from ... import
        flex_attention` binds the name: the binding gets the recording stand-in."""
        self.dense.__enter__()
        if self.dense.unavailable:
            self.unavailable.append(self.dense.unavailable)
            return
        from dflashdoctor.hooks.flex_calls import FlexCallRecorder

        self.flex = FlexCallRecorder(self.dense, self.namer, keep_calls=self.settings.last_calls).__enter__()

    def _watch_dynamo(self) -> None:
        self.watch = DynamoWatch()
        if self.settings.strict:
            self._strict()

    def _record_hf(self) -> None:
        from dflashdoctor.hooks.hf_attention import HFAttentionRecorder

        self.hf = HFAttentionRecorder(None, self.dense, self.namer).__enter__()
        if self.flex is not None:  # transformers imports flex_attention first: the flex recorder is there
            self.flex.seen_by_interface = self.hf.in_interface_call
        if self.hf.unavailable:
            self.unavailable.append(self.hf.unavailable)

    def _guard_autotuners(self) -> None:
        from dflashdoctor.hooks.autotuner_guard import AutotunerGuard

        self.guard = AutotunerGuard().__enter__()
        if self.guard.unavailable:
            self.unavailable.append(self.guard.unavailable)

    def _count_steps(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda *_: self.agent.safely("step", self._step))

    def _on_cuda_init(self) -> None:
        """Out-of-memory forensics need the allocator, which exists once CUDA initialises: queue
        the hooks for then instead of initialising CUDA in every process (a forked worker could not;
        even asking whether CUDA is available would touch the driver). A process that never uses
        CUDA never runs them."""
        lazy_call = getattr(torch.cuda, "_lazy_call", None)
        if lazy_call is None:
            self.unavailable.append("torch.cuda._lazy_call is missing: no out-of-memory observer")
            return
        lazy_call(lambda: self.agent.safely("cuda hooks", self._attach_allocator_hooks))

    def _attach_allocator_hooks(self) -> None:
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            self.unavailable.append("this torch has no out-of-memory observer: OOM seen only as an exception")
        else:
            attach(lambda *args: self.agent.safely("oom", self._out_of_memory, *args))
        if self.settings.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=_HISTORY_ENTRIES)

    def _strict(self) -> None:
        config = torch._dynamo.config
        if hasattr(config, "fail_on_recompile_limit_hit") and not getattr(config, "suppress_errors", False):
            config.fail_on_recompile_limit_hit = True
        else:
            self.unavailable.append("--strict: this torch cannot fail on the recompile limit")

    # -- what they report -------------------------------------------------------------------
    def _dense_event(self, event: DenseEvent) -> None:
        """Logged, the first few hundred: a run that is dense in every step would otherwise write a
        line per kernel for days. A kernel of a kind, site, layer or route not seen before is written
        at once (a process killed later still names it). One like a kernel already written waits for
        the next line due (a new kind of kernel, one _DENSE_BATCH_S after the oldest waiting, the
        last one logged, a snapshot) to be written with it, so a process killed meanwhile loses only
        repeats: a line written alone between two dense kernels, whose work leaves the caches cold,
        cost 50-80 us on the 2-core dev CPU, one of many written together 12 us."""
        self.dense_seen += 1
        site = event.site
        file, line = (site.get("file"), site.get("line")) if site else (None, None)
        if self.dense_seen <= _DENSE_LOGGED:
            key = (event.kind, file, line, event.layer, event.route)
            now = time.time()
            with self._dense_lock:
                pending = self._dense_pending  # the handler's snapshot may swap the list in the meantime
                pending.append((now, event))
                due = (
                    key not in self._dense_keys
                    or now - pending[0][0] >= _DENSE_BATCH_S
                    or self.dense_seen == _DENSE_LOGGED  # no later kernel would write them
                )
                self._dense_keys.add(key)
            if due:
                self._write_dense()
        if self.settings.strict:
            raise StrictModeError(
                f"dflashdoctor run --strict: flex_attention {event.kind} is about to run its dense kernel "
                f"(called at {file}:{line}); it is not compiled by Inductor"
            )

    def _write_dense(self) -> None:
        """The dense lines not yet written, each with the time its kernel ran (which takes the place
        of the log's time of writing) and the event as it stood then: the forward site and the peak
        are filled in after the kernel, and are the snapshot's."""
        with self._dense_lock:
            pending, self._dense_pending = self._dense_pending, []
        self.log.write_all(
            "dense",
            (
                {"t": round(t, 3), "event": {**_written(event), "forward_site": None, "peak_bytes": None}}
                for t, event in pending
            ),
        )

    @staticmethod
    def _describe(call: FlexCall | None) -> dict[str, Any] | None:
        if call is None:
            return None
        t, site, thread, calls_before, dense_before = call
        where = {k: getattr(site, k) for k in ("file", "line", "function", "module", "via")}
        return {
            "t": round(t, 3),
            **where,
            "thread": thread.name,  # read now: a name per call costs the step
            "calls_before": calls_before,
            "dense_forward_before": dense_before,
        }

    def _step(self) -> None:
        now = time.monotonic()
        self.steps += 1
        if self._step_ended is not None:
            self._window.add(now - self._step_ended)
        self._step_ended = now
        if self.steps <= _EVERY_STEP or now - self._last_step_record >= _STEP_RECORD_EVERY_S:
            self._write_steps(now)
        limit = self.settings.steps
        if limit is not None and self.steps >= limit:
            self.agent.ending = "steps-limit"
            self.snapshot("steps-limit")  # a final snapshot: it writes the steps since the last record first
            self.log.write("exit", ending="steps-limit", event_write_failures=self.log.failures)
            for stream in (sys.stdout, sys.stderr):  # os._exit skips Python's own flush
                stream.flush()
            os._exit(0)  # every thread stops here: the run asked for this many steps
        if now - self._last_snapshot >= _SNAPSHOT_EVERY_S:
            self.snapshot("step")

    def _write_steps(self, now: float) -> None:
        """One record for the steps since the last: the last step's number, how many it covers, the
        memory now, and the steps' wall times."""
        with self._snapshot_lock:  # a final snapshot on another thread (an exception, SIGTERM) writes them too
            if self.steps == self._recorded_steps:
                return
            covers, self._recorded_steps, self._last_step_record = self.steps - self._recorded_steps, self.steps, now
            times, self._window = self._window.summary(), _StepWindow()
            self.log.write("step", step=self.steps, covers=covers, memory=self._memory(), step_s=times)

    def _memory(self) -> dict[str, Any]:
        """Per device, from one allocator stats call each. `peak_bytes` is the allocator's running
        peak (never reset here: the program may read its own peaks); the judge reads the growth."""
        if not torch.cuda.is_initialized():
            return {}
        out = {}
        for device in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(device)
            out[f"cuda:{device}"] = {
                "allocated_bytes": stats.get("allocated_bytes.all.current", 0),
                "peak_bytes": stats.get("allocated_bytes.all.peak", 0),
                "reserved_bytes": stats.get("reserved_bytes.all.current", 0),
            }
        return out

    def _out_of_memory(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """Called by the allocator at the failed allocation, before the exception unwinds anything."""
        snapshot_path = None
        if self.settings.memory_snapshot:
            snapshot_path = os.path.join(self.agent.folder, f"memory-snapshot-{os.getpid()}.pickle")
            torch.cuda.memory._dump_snapshot(snapshot_path)
        flex: FlexCallRecorder | None = self.flex
        in_flight = (flex.in_flight if flex is not None else None) or {}
        self.oom = {
            "device": f"cuda:{device}",
            "requested_bytes": alloc,
            "device_total_bytes": device_total,  # or the limit set with set_per_process_memory_fraction
            "free_bytes": device_free,
            "thread": threading.current_thread().name,
            "in_flight": self._describe(in_flight.get(threading.get_ident())),
            "last_calls": [self._describe(call) for call in list(flex.last_calls)] if flex else [],
            "dense_events": [e.to_dict() for e in self.dense.events[-8:]],
            "memory_snapshot": snapshot_path,
            "steps": self.steps,
        }
        self.log.write("oom", **self.oom)

    def module_of(self, tb: TracebackType | None) -> str | None:
        """The innermost user nn.Module (not one of torch's own, such as an FX GraphModule) whose
        forward was running where an exception was raised."""
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame if tb is not None else None
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, torch.nn.Module) and not type(candidate).__module__.startswith("torch."):
                return self.namer.name(candidate, frame)
            frame = frame.f_back
        return None

    def snapshot(self, reason: str) -> None:
        with self._snapshot_lock:
            if reason in FINAL_SNAPSHOTS:  # the steps since the last record are part of the end
                self._write_steps(time.monotonic())
            self._write_dense()  # the dense kernels still waiting come before it
            self._last_snapshot = time.monotonic()
            self.log.write("snapshot", reason=reason, observations=self._observations(final=reason in FINAL_SNAPSHOTS))

    def _observations(self, *, final: bool) -> dict[str, Any]:
        """observations.RunSnapshot's JSON, which the doctor loads strictly."""
        if self.flex is not None and final:  # finding the names wrappers are bound to walks every module
            main = sys.modules.get("__main__")
            self.flex.name_wrappers({"__main__": vars(main)} if main is not None else {})
        watch = self.watch
        if watch is not None:
            watch.collect("run")
        guard = self.guard
        transformers = sys.modules.get("transformers")
        script: TracedScript = {  # the program is the traced script; FLA's state is env's to report
            "script": sys.argv[0] if sys.argv else "",
            "error": None,
            "fla": None,
            "fla_import_stopped": None,
            "fla_refused": None,
            "layers": self.hf.layers() if self.hf is not None else [],
            "sites": [s.to_dict() for s in list(self.hf.sites.values())] if self.hf is not None else [],
            "flex_sites": [s.to_dict() for s in list(self.flex.sites.values())] if self.flex is not None else [],
            "compile_calls": list(self.flex.compile_calls) if self.flex is not None else [],
            "hook_unavailable": self.hf.unavailable if self.hf is not None else None,
        }
        snapshot = RunSnapshot(
            device="cuda" if torch.cuda.is_initialized() else "cpu",
            torch=torch.__version__,
            python=sys.version.split()[0],
            transformers=getattr(transformers, "__version__", None),
            traced_script=script,
            compiles=list(watch.records) if watch is not None else [],
            graph_breaks=dict(watch.graph_breaks) if watch is not None else {},
            graph_break_sites=[GraphBreakSite(**site) for site in watch.graph_break_sites] if watch is not None else [],
            dynamo_disabled=_dynamo_disabled(),
            dense_events=list(self.dense.events)[-_DENSE_LOGGED:],
            dense_events_total=self.dense_seen,
            hook_unavailable=self.dense.unavailable,
            steps=self.steps,
            memory=self._memory(),
            autotuner_overlaps=[e.to_dict() for e in list(guard.events)] if guard is not None else [],
            autotuned_kernels=guard.kernels_entered() if guard is not None else [],
            unavailable=list(self.unavailable),
        )
        return dump(snapshot)
