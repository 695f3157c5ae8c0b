"""CPU benchmark of the multi-blank RNN-T loss: forward + backward w.r.t. the logits.

All contenders run side by side in ONE invocation (absolute times move by tens of
percent between runs on shared machines; compare within a run only):

* ``log_softmax``: one ``torch.log_softmax`` over the same logits, output allocated by
  torch (the yardstick: one read + one write of the logits; an exact loss cannot be much
  faster than ~1.5x this);
* ``ours-numba``: ``multiblank_rnnt_loss(..., backend="numba")`` (the fused CPU kernel);
* ``ours-torch``: ``backend="torch"`` (pure PyTorch; slow: only on the --quick shapes);
* ``espnet``: ESPnet's CPU ``RNNTLossNumba`` (standard loss only; very slow: only with
  ``--espnet`` and on the --quick shapes);
* ``torchaudio``: ``torchaudio.functional.rnnt_loss(fused_log_softmax=True)`` (standard
  loss only), ``optimized_transducer`` and ``fast_rnnt`` (standard loss only), each if
  importable; skipped with the reason otherwise.

Inputs: float32 logits ~ N(0, 1), full lengths, reduction "mean". Standard loss:
blank 0, labels uniform in [1, V). Multi-blank (durations [2, 4, 8]): blank = V - 1,
labels uniform in [0, V - 4) (never a blank id).

Time: median of ``--runs`` runs after ``--warmup`` runs, in this process, with
``torch.set_num_threads(--threads)`` (default 1; our Numba kernel uses as many threads
as torch). Slow contenders use ``--slow-runs`` runs.

Memory: for each (shape, contender), a fresh subprocess loads the contender (one tiny
call, so that imports and kernel loading are not counted), allocates the inputs, resets
the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``), runs forward +
backward once and reports ``VmHWM`` (peak RSS) minus the RSS just before the call, i.e.
the peak memory above the inputs, in MB. Where clear_refs is not writable it falls back
to ``ru_maxrss`` (peak RSS since the process started) minus the RSS before the call,
which is only right when the call sets a new peak (true for large inputs).

Also reported: the first-call cost of our kernel in a fresh subprocess with a warm Numba
cache (import of the CPU backend, first float32 call standard and multi-blank, second
call).

Usage::

    python bench/loss_cpu.py --quick          # first and last shape, ~1 minute
    python bench/loss_cpu.py                  # all shapes
    python bench/loss_cpu.py --quick --espnet # + ESPnet's (very slow) CPU loss
    python bench/loss_cpu.py --threads 2 --runs 9 --no-memory
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

SHAPES = [(4, 150, 40, 128), (8, 200, 60, 256), (2, 500, 100, 1024), (16, 100, 20, 64)]
QUICK_SHAPES = [SHAPES[0], SHAPES[-1]]
DURATION_SETS = [(), (2, 4, 8)]
CONTENDERS = [
    "log_softmax",
    "ours-numba",
    "ours-torch",
    "espnet",
    "torchaudio",
    "optimized_transducer",
    "fast_rnnt",
]
SLOW = {"ours-torch", "espnet"}
STANDARD_ONLY = {"espnet", "torchaudio", "optimized_transducer", "fast_rnnt"}

Shape = Tuple[int, int, int, int]


# ----------------------------------------------------------------------------- inputs
def make_inputs(shape: Shape, durations: Sequence[int], seed: int = 0):
    """float32 logits, int32 labels / lengths (full lengths) and the blank id."""
    B, T, U, V = shape
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U, V, generator=gen)
    if durations:
        blank = V - 1
        labels = torch.randint(0, V - 4, (B, U - 1), generator=gen, dtype=torch.int32)
    else:
        blank = 0
        labels = torch.randint(1, V, (B, U - 1), generator=gen, dtype=torch.int32)
    act_lens = torch.full((B,), T, dtype=torch.int32)
    label_lens = torch.full((B,), U - 1, dtype=torch.int32)
    return logits, labels, act_lens, label_lens, blank


def _fwd_bwd(loss_fn: Callable, logits: torch.Tensor) -> Callable[[], float]:
    """A run(): fresh leaf, loss, backward; returns the loss value."""

    def run():
        x = logits.detach().requires_grad_(True)
        loss = loss_fn(x)
        loss.backward()
        value = float(loss.detach().reshape(-1)[0])
        del x, loss
        return value

    return run


def make_contender(
    name: str, logits, labels, act_lens, label_lens, blank, durations
) -> Callable[[], float]:
    """A zero-argument forward + backward for contender ``name`` (raises when the
    contender is unavailable or does not support the case)."""
    if name in STANDARD_ONLY and durations:
        raise NotImplementedError("standard RNN-T only")
    if name == "log_softmax":

        def run():
            torch.log_softmax(logits, dim=-1)  # the result is dropped at once
            return float("nan")

        return run
    if name in ("ours-numba", "ours-torch"):
        from espnet_multiblank import multiblank_rnnt_loss

        backend = name.split("-")[1]
        return _fwd_bwd(
            lambda x: multiblank_rnnt_loss(
                x,
                labels,
                act_lens,
                label_lens,
                blank,
                durations,
                "mean",
                backend=backend,
            ),
            logits,
        )
    if name == "espnet":
        from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import (
            RNNTLossNumba,
        )

        import espnet_multiblank.espnet.quiet  # noqa: F401  (silence nltk)

        loss = RNNTLossNumba(blank=blank, reduction="mean")
        return _fwd_bwd(lambda x: loss(x, labels, act_lens, label_lens), logits)
    if name == "torchaudio":
        import torchaudio.functional as F

        return _fwd_bwd(
            lambda x: F.rnnt_loss(
                x,
                labels,
                act_lens,
                label_lens,
                blank=blank,
                reduction="mean",
                fused_log_softmax=True,
            ),
            logits,
        )
    if name == "optimized_transducer":
        import optimized_transducer

        V = logits.shape[-1]
        # it takes the logits of all utterances concatenated, (sum_b T_b (U_b), V)
        return _fwd_bwd(
            lambda x: optimized_transducer.transducer_loss(
                logits=x.reshape(-1, V),
                targets=labels,
                logit_lengths=act_lens,
                target_lengths=label_lens,
                blank=blank,
                reduction="mean",
                from_log_softmax=False,
            ),
            logits,
        )
    if name == "fast_rnnt":
        import fast_rnnt

        B, T, U, _ = logits.shape
        boundary = torch.zeros(B, 4, dtype=torch.int64)
        boundary[:, 2] = U - 1
        boundary[:, 3] = T
        return _fwd_bwd(
            lambda x: fast_rnnt.rnnt_loss(
                logits=x,
                symbols=labels.long(),
                termination_symbol=blank,
                boundary=boundary,
                reduction="mean",
            ),
            logits,
        )
    raise ValueError(name)


def probe(name: str, durations) -> Optional[str]:
    """None if ``name`` runs on a tiny input, else the reason it cannot."""
    try:
        V = 8
        run = make_contender(
            name, *make_inputs((2, 4, 3, V), durations, seed=1), durations
        )
        run()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "skip, with the reason"
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


# ----------------------------------------------------------------------------- timing
def time_runs(run: Callable[[], float], warmup: int, runs: int):
    for _ in range(warmup):
        run()
    times, value = [], float("nan")
    for _ in range(runs):
        t0 = time.perf_counter()
        value = run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


# ----------------------------------------------------------------------------- memory
def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_child(name: str, shape: Shape, durations, threads: int) -> dict:
    """Runs in a fresh subprocess: peak RSS above the inputs of one forward+backward."""
    torch.set_num_threads(threads)
    make_contender(name, *make_inputs((2, 4, 3, shape[3]), durations, 1), durations)()
    inputs = make_inputs(shape, durations)
    run = make_contender(name, *inputs, durations)
    if _reset_peak() and _status_kb("VmHWM") is not None:
        before = _status_kb("VmRSS")
        run()
        peak = _status_kb("VmHWM")
        method = "VmHWM after clear_refs"
    else:
        before = _status_kb("VmRSS") or 0
        run()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        method = "ru_maxrss"
    return {"peak_mb": (peak - before) / 1024.0, "method": method}


def measure_memory(name: str, shape: Shape, durations, threads: int):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        name,
        "--shape",
        ",".join(map(str, shape)),
        "--durations",
        ",".join(map(str, durations)),
        "--threads",
        str(threads),
    ]
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, check=True, timeout=900
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001
        return {"peak_mb": float("nan"), "method": f"failed ({type(e).__name__})"}


# ---------------------------------------------------------------------------- load time
def load_child() -> dict:
    """Fresh process: import of the CPU backend and first calls of our kernel."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    import espnet_multiblank.loss.cpu  # noqa: F401

    t1 = time.perf_counter()
    out = {"import_s": t1 - t0}
    for key, durations in (("first_call_std_s", ()), ("first_call_mb_s", (2, 4, 8))):
        run = make_contender(
            "ours-numba", *make_inputs((2, 6, 4, 16), durations, 1), durations
        )
        t = time.perf_counter()
        run()
        out[key] = time.perf_counter() - t
    t = time.perf_counter()
    run()
    out["second_call_s"] = time.perf_counter() - t
    return out


def measure_load_time() -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--load-child"]
    results = []
    for _ in range(2):  # the first one fills the Numba cache if it was cold
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, check=True, timeout=900
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        except Exception as e:  # noqa: BLE001
            results.append({"error": f"{type(e).__name__}: {e}"})
    return {"first_process": results[0], "cache_warm": results[1]}


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="first and last shape only")
    p.add_argument("--threads", type=int, default=1, help="torch (and Numba) threads")
    p.add_argument("--runs", type=int, default=5, help="timed runs (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    p.add_argument("--slow-runs", type=int, default=1, help="runs for slow contenders")
    p.add_argument("--espnet", action="store_true", help="add ESPnet's CPU loss")
    p.add_argument("--no-memory", action="store_true", help="skip the memory column")
    p.add_argument("--no-load-time", action="store_true", help="skip the load time")
    p.add_argument("--durations", default=None, help=argparse.SUPPRESS)
    p.add_argument("--shape", default=None, help="B,T,U,V: one shape only")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--load-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _parse_ints(text: Optional[str]) -> Tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v) if text else ()


def main(argv=None):
    args = parse_args(argv)
    if args.memory_child:
        res = memory_child(
            args.memory_child,
            _parse_ints(args.shape),
            _parse_ints(args.durations),
            args.threads,
        )
        print(json.dumps(res))
        return
    if args.load_child:
        print(json.dumps(load_child()))
        return

    torch.set_num_threads(args.threads)
    shapes = (
        [_parse_ints(args.shape)]
        if args.shape
        else (QUICK_SHAPES if args.quick else SHAPES)
    )
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), float32, full lengths, "
        f"reduction='mean', median of {args.runs} runs after {args.warmup} warm-up "
        f"(slow contenders: {args.slow_runs} run(s))"
    )
    if not args.no_load_time:
        lt = measure_load_time()
        for label, res in (
            ("fresh process, Numba cache warm", lt["cache_warm"]),
            ("first process (cache possibly cold)", lt["first_process"]),
        ):
            if "error" in res:
                print(f"our CPU kernel, {label}: {res['error']}")
                continue
            print(
                f"our CPU kernel, {label}: import {res['import_s']:.2f} s, first call "
                f"(standard) {res['first_call_std_s']:.3f} s, first call (multi-blank) "
                f"{res['first_call_mb_s']:.3f} s, then {res['second_call_s']:.4f} s"
            )

    available = {}
    for durations in DURATION_SETS:
        for name in CONTENDERS:
            if name == "espnet" and not args.espnet:
                available[name, durations] = "needs --espnet"
            elif name in STANDARD_ONLY and durations:
                available[name, durations] = "standard RNN-T only"
            else:
                available[name, durations] = probe(name, durations)

    header = (
        f"{'shape (B,T,U,V)':<20} {'durations':<10} {'contender':<21} "
        f"{'median s':>10} {'runs':>4} {'x log_softmax':>13} "
        f"{'peak MB':>9} {'loss':>12}"
    )
    rows: List[str] = []
    print("\n" + header + "\n" + "-" * len(header))
    skipped = set()
    for shape in shapes:
        logits_mb = shape[0] * shape[1] * shape[2] * shape[3] * 4 / 2**20
        for durations in DURATION_SETS:
            inputs = make_inputs(shape, durations)
            yard = None
            for name in CONTENDERS:
                reason = available[name, durations]
                if reason is None and name in SLOW and shape not in QUICK_SHAPES:
                    reason = "only on the --quick shapes (slow)"
                if reason is not None:
                    skipped.add(f"{name} {list(durations)}: {reason}")
                    continue
                run = make_contender(name, *inputs, durations)
                runs = args.slow_runs if name in SLOW else args.runs
                warmup = min(args.warmup, 1) if name in SLOW else args.warmup
                try:
                    med, value = time_runs(run, warmup, runs)
                except Exception as e:  # noqa: BLE001
                    skipped.add(f"{name} {shape} {list(durations)}: failed: {e}")
                    continue
                if name == "log_softmax":
                    yard = med
                mem = (
                    float("nan")
                    if args.no_memory
                    else measure_memory(name, shape, durations, args.threads)["peak_mb"]
                )
                ratio = med / yard if yard else float("nan")
                row = (
                    f"{str(shape):<20} {str(list(durations)):<10} {name:<21} "
                    f"{med:>10.4f} {runs:>4} {ratio:>13.2f} {mem:>9.0f} {value:>12.4f}"
                )
                rows.append(row)
                print(row, flush=True)
        print(f"{'':<20} (logits: {logits_mb:.0f} MB)")
    if skipped:
        print("\nnot run:")
        for s in sorted(skipped):
            print("  " + s)
    if not args.no_memory:
        print(
            "\npeak MB: peak RSS of one forward+backward above the RSS after the "
            "inputs were allocated, fresh subprocess per cell (VmHWM after clear_refs; "
            "ru_maxrss fallback)"
        )


if __name__ == "__main__":
    main()
