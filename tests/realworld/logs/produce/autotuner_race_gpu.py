"""Two data-parallel "pairs" on threads, as a trainer that drives two GPU pairs from one process does,
each calling one module-level Triton autotuned kernel (an RMSNorm with several configs, the shape of
FLA's autotuned norms) on its own inputs. Each new size is tuned cold, so one thread benchmarks
configs while the other enters the same `Autotuner.run` and clears its `nargs`. Needs a GPU and a
fresh TRITON_CACHE_DIR. Produces `37_produced_h200_thread_autotuner_race.log`."""

import threading

import torch
import triton

from tests.realworld.logs.produce.cache_step_gpu import rms_norm_kernel as plain_rms_norm_kernel

# cache_step_gpu.py's RMSNorm kernel, autotuned over launch configs as FLA's norms are
rms_norm_kernel = triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=s) for w in (1, 2, 4, 8, 16) for s in (1, 2, 3)],
    key=["N"],
)(plain_rms_norm_kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    rows, n = x.shape
    rms_norm_kernel[(rows,)](x, weight, out, n, 1e-6, BLOCK=triton.next_power_of_2(n))
    return out


def pair(index: int) -> None:
    for hidden in (512, 1024, 2048, 4096, 8192):
        x = torch.randn(4096, hidden, device="cuda")
        weight = torch.ones(hidden, device="cuda")
        rms_norm(x, weight).sum().item()


failed: list[str] = []


def note_failure(args: threading.ExceptHookArgs) -> None:
    failed.append(args.thread.name if args.thread else "?")
    threading.__excepthook__(args)


threading.excepthook = note_failure
threads = [threading.Thread(target=pair, args=(i,), name=f"pair-{i}") for i in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
if failed:
    raise SystemExit(f"pairs failed: {failed}")
print("both pairs finished", flush=True)
