"""CPU benchmark of the multi-blank RNN-T loss: forward + backward w.r.t. the logits.

All contenders run side by side in ONE invocation, in interleaved rounds (one run of
each contender per round), for each torch thread count asked for (default 1 and 2):
absolute times move by tens of percent on shared machines, ratios measured together
much less. The ratio columns divide by ``log_softmax`` at the same thread count.

* ``log_softmax``: one ``torch.log_softmax`` over the same logits, output allocated by
  torch (the yardstick: one read + one write of the logits);
* ``log_softmax(out=)``: the same into a preallocated output: no allocation. torch's
  allocations of more than a few MB are fresh pages on every call here (page faults
  cost about 1 ns per byte on the virtual machines measured), so at large shapes the
  yardstick above is mostly page faults; this row shows the pure compute + traffic;
* ``ours-numba``: ``multiblank_rnnt_loss(..., backend="numba")``, ``loss.backward()``;
* ``ours-numba x0.7``: the same with a gradient of 0.7 flowing in
  (``(0.7 * loss).backward()``: what ``1 - ctc_weight``, ``1 / accum_grad`` or an AMP
  loss scale do in training);
* ``ours-torch``: ``backend="torch"`` (pure PyTorch; slow: only on the --quick shapes);
* ``espnet``: ESPnet's CPU ``RNNTLossNumba`` (standard loss only; very slow: only with
  ``--espnet`` and on the --quick shapes);
* ``torchaudio``: ``torchaudio.functional.rnnt_loss(fused_log_softmax=True)`` (standard
  loss only), ``optimized_transducer`` and ``fast_rnnt`` (standard loss only), each if
  importable (``bash bench/anchor_venv.sh`` builds a side venv with
  optimized_transducer; run this script with its python); skipped with the reason
  otherwise. optimized_transducer writes its gradient over the input logits (its way
  of saving memory): it runs on a private copy of the logits, refreshed before each
  run outside the timed region.

Inputs: float32 logits ~ N(0, 1), full lengths, reduction "mean". Standard loss:
blank 0, labels uniform in [1, V). Multi-blank (durations [2, 4, 8]): blank = V - 1,
labels uniform in [0, V - 4) (never a blank id). TDT ("TDT 0-4": ``tdt_loss`` with
durations [0, 1, 2, 3, 4]): (B, T, U, V + 5) logits, blank 0, labels in [1, V); its
``log_softmax`` rows run over the same (B, T, U, V + 5) logits.

Time: wall clock of ``--runs`` rounds after ``--warmup`` rounds, in this process, with
``torch.set_num_threads(n)`` (our Numba kernel uses as many threads as torch); slow
contenders use ``--slow-runs`` runs. Columns per thread count: median seconds, median
/ median of ``log_softmax`` ("x ls"), and minimum / minimum ("min"). The machine's load
average is printed before and after: on a loaded machine a call of a few ms is often
preempted, which inflates the medians of the slower contenders; the minimum is then
the better estimate of the undisturbed ratio.

Memory: for each (shape, contender), a fresh subprocess (first thread count) loads the
contender (one tiny call, so that imports and kernel loading are not counted),
allocates the inputs, resets the kernel's peak-RSS counter (``echo 5 >
/proc/self/clear_refs``), runs forward + backward once and reports ``VmHWM`` (peak RSS)
minus the RSS just before the call, i.e. the peak memory above the inputs, in MB. Where
clear_refs is not writable it falls back to ``ru_maxrss`` (peak RSS since the process
started) minus the RSS before the call, which is only right when the call sets a new
peak (true for large inputs).

Also reported: the first-call cost of our kernel in a fresh subprocess with a warm Numba
cache (import of the CPU backend, first float32 call standard and multi-blank, second
call).

Before / after a change (``--compare DIR``): ``ours-numba`` and ``ours-numba x0.7``
of the package in another checkout (DIR: its repository root, e.g. the commit before,
unpacked with ``git archive``) run in a worker process started with DIR first on its
``PYTHONPATH``, one run per round interleaved with this process's contenders on the
same inputs (the worker times its own runs: no pipe in the timed region); its rows are
marked ``[compare]`` (no memory column).

Usage::

    python bench/loss_cpu.py --quick          # shapes 1 and 4, 1 and 2 threads
    python bench/loss_cpu.py                  # all shapes
    python bench/loss_cpu.py --quick --espnet # + ESPnet's (very slow) CPU loss
    python bench/loss_cpu.py --threads 1 --runs 9 --no-memory
    .anchors/bin/python bench/loss_cpu.py     # with optimized_transducer
    mkdir -p /tmp/before && git archive <commit> | tar -x -C /tmp/before
    python bench/loss_cpu.py --compare /tmp/before --no-memory   # before vs after
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

SHAPES = [
    (4, 150, 40, 128),
    (8, 200, 60, 256),
    (2, 500, 100, 1024),
    (16, 100, 20, 64),
    (32, 100, 30, 500),
]
QUICK_SHAPES = [SHAPES[0], SHAPES[3]]
# durations containing 0 are a TDT case (a multi-blank duration is >= 2)
TDT_DURATIONS = (0, 1, 2, 3, 4)
DURATION_SETS = [(), (2, 4, 8), TDT_DURATIONS]
CONTENDERS = [
    "log_softmax",
    "log_softmax(out=)",
    "ours-numba",
    "ours-numba x0.7",
    "ours-torch",
    "espnet",
    "torchaudio",
    "optimized_transducer",
    "fast_rnnt",
]
SLOW = {"ours-torch", "espnet"}
STANDARD_ONLY = {"espnet", "torchaudio", "optimized_transducer", "fast_rnnt"}

Shape = Tuple[int, int, int, int]


def is_tdt(durations: Sequence[int]) -> bool:
    """Whether a durations tuple names the TDT case (a multi-blank one has no 0)."""
    return 0 in durations


# ----------------------------------------------------------------------------- inputs
def make_inputs(shape: Shape, durations: Sequence[int], seed: int = 0):
    """float32 logits, int32 labels / lengths (full lengths) and the blank id. TDT:
    (B, T, U, V + D) logits, V token logits then D duration logits."""
    B, T, U, V = shape
    gen = torch.Generator().manual_seed(seed)
    tdt = is_tdt(durations)
    logits = torch.randn(B, T, U, V + (len(durations) if tdt else 0), generator=gen)
    if durations and not tdt:
        blank = V - 1
        labels = torch.randint(0, V - 4, (B, U - 1), generator=gen, dtype=torch.int32)
    else:
        blank = 0
        labels = torch.randint(1, V, (B, U - 1), generator=gen, dtype=torch.int32)
    act_lens = torch.full((B,), T, dtype=torch.int32)
    label_lens = torch.full((B,), U - 1, dtype=torch.int32)
    return logits, labels, act_lens, label_lens, blank


def _fwd_bwd(
    loss_fn: Callable, logits: torch.Tensor, incoming: float = 1.0
) -> Callable[[], float]:
    """A run(): fresh leaf, loss, backward (with ``incoming`` flowing in unless 1);
    returns the loss value."""

    def run():
        x = logits.detach().requires_grad_(True)
        loss = loss_fn(x)
        (loss if incoming == 1.0 else incoming * loss).backward()
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
    if name == "log_softmax(out=)":
        out = torch.empty_like(logits)

        def run_out():
            torch.log_softmax(logits, dim=-1, out=out)
            return float("nan")

        return run_out
    if name in ("ours-numba", "ours-numba x0.7", "ours-torch"):
        from espnet_multiblank import multiblank_rnnt_loss, tdt_loss

        backend = name.split("-")[1].split()[0]
        if is_tdt(durations):
            return _fwd_bwd(
                lambda x: tdt_loss(
                    x,
                    labels,
                    act_lens,
                    label_lens,
                    blank,
                    durations,
                    reduction="mean",
                    backend=backend,
                ),
                logits,
                0.7 if name.endswith("x0.7") else 1.0,
            )
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
            0.7 if name.endswith("x0.7") else 1.0,
        )
    if name == "espnet":
        from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import (
            RNNTLossNumba,
        )

        import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (silence nltk)

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
        # It writes the gradient over its input logits (that is how it saves memory),
        # so it runs on a private copy, refreshed before every run (untimed).
        own = logits.clone()

        def refresh():
            own.copy_(logits)

        # it takes the logits of all utterances concatenated, (sum_b T_b (U_b), V)
        run = _fwd_bwd(
            lambda x: optimized_transducer.transducer_loss(
                logits=x.reshape(-1, V),
                targets=labels,
                logit_lengths=act_lens,
                target_lengths=label_lens,
                blank=blank,
                reduction="mean",
                from_log_softmax=False,
            ),
            own,
        )
        run.prepare = refresh
        return run
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
def time_interleaved(
    runs_by_name: Dict[str, Callable[[], float]],
    counts: Dict[str, Tuple[int, int]],
) -> Dict[str, Tuple[List[float], float]]:
    """Time the contenders in interleaved rounds: round r runs every contender that
    still has runs left once, in order. ``counts[name] = (warmup, runs)``.

    Returns ``{name: (the times of the timed runs, last loss value)}``; a contender
    that raises is left out (its error printed).
    """
    value = {name: float("nan") for name in runs_by_name}
    times: Dict[str, List[float]] = {name: [] for name in runs_by_name}
    failed = set()
    rounds = max(w + r for w, r in counts.values())
    for rnd in range(rounds):
        for name, run in runs_by_name.items():
            warmup, runs = counts[name]
            if name in failed or rnd >= warmup + runs:
                continue
            try:
                prepare = getattr(run, "prepare", None)
                if prepare is not None:
                    prepare()
                t0 = time.perf_counter()
                v = run()
                dt = time.perf_counter() - t0
                if getattr(run, "timed_inside", False):  # (value, its own time)
                    v, dt = v
            except Exception as e:  # noqa: BLE001 - report and drop the contender
                print(f"  {name}: failed: {type(e).__name__}: {e}", flush=True)
                failed.add(name)
                continue
            value[name] = v
            if rnd >= warmup:
                times[name].append(dt)
    return {
        name: (ts, value[name])
        for name, ts in times.items()
        if ts and name not in failed
    }


# ------------------------------------------------------------------- --compare worker
COMPARED = ("ours-numba", "ours-numba x0.7")
COMPARE_TAG = " [compare]"


def worker_main() -> None:
    """The --compare worker: one JSON command per line on stdin, ``{"name", "shape",
    "durations", "threads"}``; runs that contender once (on the same seeded inputs as
    the parent) and answers ``{"value", "dt"}`` on stdout."""
    import espnet_multiblank

    print(json.dumps({"package": os.path.dirname(espnet_multiblank.__file__)}))
    sys.stdout.flush()
    runs = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        key = (cmd["name"], tuple(cmd["shape"]), tuple(cmd["durations"]))
        if key not in runs:
            durations = tuple(cmd["durations"])
            runs = {  # one shape at a time: drop the previous inputs
                k: v for k, v in runs.items() if k[1:] == key[1:]
            }
            inputs = make_inputs(tuple(cmd["shape"]), durations)
            runs[key] = make_contender(cmd["name"], *inputs, durations)
        torch.set_num_threads(cmd["threads"])
        t0 = time.perf_counter()
        value = runs[key]()
        dt = time.perf_counter() - t0
        print(json.dumps({"value": value, "dt": dt}))
        sys.stdout.flush()


class CompareWorker:
    """The --compare worker process (the other checkout first on its PYTHONPATH)."""

    def __init__(self, root: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = (
            os.path.abspath(root) + os.pathsep + env.get("PYTHONPATH", "")
        )
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.package = json.loads(self.proc.stdout.readline())["package"]

    def run(self, name: str, shape: Shape, durations) -> Tuple[float, float]:
        cmd = dict(
            name=name,
            shape=list(shape),
            durations=list(durations),
            threads=torch.get_num_threads(),
        )
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the --compare worker died")
        res = json.loads(line)
        return res["value"], res["dt"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def remote_contender(worker: CompareWorker, name: str, shape: Shape, durations):
    """A run() of ``name`` in the worker; returns (value, the worker's own time)."""

    def run():
        return worker.run(name, shape, durations)

    run.timed_inside = True
    return run


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


def _numba_version() -> str:
    try:
        import numba

        return numba.__version__
    except ImportError:
        return "not installed"


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
    p.add_argument(
        "--threads",
        default="1,2",
        help="torch (and Numba) thread counts, comma-separated (default 1,2)",
    )
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
    p.add_argument(
        "--compare",
        default=None,
        metavar="DIR",
        help="also run ours-numba of the checkout at DIR (its repository root), in "
        "a worker process, round by round with this one's",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
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
            int(args.threads),
        )
        print(json.dumps(res))
        return
    if args.load_child:
        print(json.dumps(load_child()))
        return
    if args.worker:
        worker_main()
        return
    worker = CompareWorker(args.compare) if args.compare else None
    if worker is not None:
        import espnet_multiblank

        here = os.path.dirname(espnet_multiblank.__file__)
        print(f"--compare: this process runs {here}, the worker {worker.package}")
        if os.path.realpath(here) == os.path.realpath(worker.package):
            raise SystemExit("--compare: both import the same package")

    threads = list(_parse_ints(args.threads)) or [1]
    torch.set_num_threads(threads[0])
    shapes = (
        [_parse_ints(args.shape)]
        if args.shape
        else (QUICK_SHAPES if args.quick else SHAPES)
    )
    print(
        f"torch {torch.__version__}, numba {_numba_version()}, threads {threads}, "
        f"float32, full lengths, reduction='mean', {args.runs} interleaved rounds "
        f"after {args.warmup} warm-up "
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
            elif name == "espnet" and is_tdt(durations):
                available[name, durations] = "no TDT"
            else:
                available[name, durations] = probe(name, durations)

    head = f"{'shape (B,T,U,V)':<20} {'durations':<10} {'contender':<27}"
    for n in threads:
        head += f" {f's ({n}t)':>8} {f'x ls ({n}t)':>10} {'min':>5}"
    head += f" {'runs':>4} {'peak MB':>8} {'loss':>12}"
    print(f"\nload average before: {_load()}")
    print("\n" + head + "\n" + "-" * len(head), flush=True)
    skipped = set()
    for shape in shapes:
        logits_mb = shape[0] * shape[1] * shape[2] * shape[3] * 4 / 2**20
        for durations in DURATION_SETS:
            inputs = make_inputs(shape, durations)
            names = []
            for name in CONTENDERS:
                reason = available[name, durations]
                if reason is None and name in SLOW and shape not in QUICK_SHAPES:
                    reason = "only on the --quick shapes (slow)"
                if reason is not None:
                    skipped.add(f"{name} {list(durations)}: {reason}")
                    continue
                names.append(name)
            runs_by_name = {n: make_contender(n, *inputs, durations) for n in names}
            if worker is not None:
                for n in COMPARED:
                    if n in runs_by_name:
                        runs_by_name[n + COMPARE_TAG] = remote_contender(
                            worker, n, shape, durations
                        )
                names = list(runs_by_name)
            counts = {
                n: (
                    (min(args.warmup, 1), args.slow_runs)
                    if n in SLOW
                    else (args.warmup, args.runs)
                )
                for n in names
            }
            results = {}
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                results[n_threads] = time_interleaved(runs_by_name, counts)
            for name in names:
                if not any(name in results[n] for n in threads):
                    continue
                dlabel = "TDT 0-4" if is_tdt(durations) else str(list(durations))
                row = f"{str(shape):<20} {dlabel:<10} {name:<27}"
                value, runs = float("nan"), 0
                for n in threads:
                    res = results[n].get(name)
                    yard = results[n].get("log_softmax")
                    if res is None:
                        row += f" {'-':>8} {'-':>10} {'-':>5}"
                        continue
                    ts, value = res
                    runs = len(ts)
                    med = statistics.median(ts)
                    ratio = med / statistics.median(yard[0]) if yard else float("nan")
                    ratio_min = min(ts) / min(yard[0]) if yard else float("nan")
                    row += f" {med:>8.4f} {ratio:>10.2f} {ratio_min:>5.2f}"
                mem = (
                    float("nan")
                    if args.no_memory or name.endswith(COMPARE_TAG)
                    else measure_memory(name, shape, durations, threads[0])["peak_mb"]
                )
                row += f" {runs:>4} {mem:>8.0f} {value:>12.4f}"
                print(row, flush=True)
            del runs_by_name, inputs
        print(f"{'':<20} (logits: {logits_mb:.0f} MB)", flush=True)
    print(f"\nload average after: {_load()}")
    if worker is not None:
        worker.close()
    if skipped:
        print("\nnot run:")
        for s in sorted(skipped):
            print("  " + s)
    if not args.no_memory:
        print(
            "\npeak MB: peak RSS of one forward+backward above the RSS after the "
            "inputs were allocated, fresh subprocess per cell, "
            f"{threads[0]} thread(s) (VmHWM after clear_refs; ru_maxrss fallback)"
        )


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg()) + (
            f" (1, 5, 15 min; {os.cpu_count()} CPUs)"
        )
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
