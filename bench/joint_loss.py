"""One training step of the transducer joint + loss: dense, fused and their anchors,
side by side in ONE run (time and peak memory above the inputs).

A step starts from the joint's inputs, the projected encoder output ``enc`` (B, T, J)
and prediction-network output ``pred`` (B, U + 1, J) (ESPnet's ``lin_enc`` /
``lin_dec`` outputs; U = labels per utterance), and the output layer ``weight`` (V',
J), ``bias`` (V',) (V' = V, or V + 5 for the TDT); it runs forward and backward and
leaves the gradients of all four. Contenders:

* ``dense``: ``logits = F.linear(tanh(enc[:, :, None] + pred[:, None]), weight,
  bias)`` (ESPnet's JointNetwork), then this package's dense loss
  (``multiblank_rnnt_loss`` / ``tdt_loss``, Numba kernels);
* ``fused``: :func:`espnet_multiblank.fused_transducer_loss` (``--fused-tiles`` adds
  variants with other tile sizes, for tuning; ``--fused-tile-backends torch`` a
  ``fused-torch-tiles`` row, the tile stages as torch operations: on a GPU the path
  before issue 40's Triton kernels);
* ``nemo-fused-batch``: NeMo's "fused batch" re-created over the dense path: the joint
  and the loss (reduction "none") per sub-batch of ``--sub-batch`` utterances, each
  trimmed to its own longest T and U, costs concatenated, then the same reduction;
  every sub-batch's gradient buffer and hidden activations stay alive until backward
  (as in NeMo). With B = --sub-batch it is the dense path on trimmed lengths;
* anchors (standard RNN-T only), each run by the python of ``--anchor-python`` (a side
  venv, e.g. ``bash bench/anchor_venv.sh``; this repository installed in it):
  ``optimized_transducer`` (its loss on the packed joint, the logits of all
  utterances concatenated, tanh joint per utterance) and ``k2-pruned`` (fast_rnnt:
  ``rnnt_loss_smoothed`` on V-sized simple projections of enc and pred, prune ranges
  of 5 symbols, the tanh joint on the pruned band, ``rnnt_loss_pruned``; loss =
  0.5 simple + pruned, icefall's recipe; approximate: not the same loss). An anchor
  whose import fails is reported with the reason.

Lattices (``--lattices``): ``standard`` (blank 0), ``multiblank`` (big blanks [2, 4, 8],
blank V - 1), ``tdt`` (durations [0, 1, 2, 3, 4], blank 0). Inputs: float32 ~ N(0, 1)
(weight / sqrt(J)), random labels that are no blank, full lengths, reduction "mean".

Every contender runs in its own worker process (this script with ``--worker``, under
the contender's python), which loads its code, runs one tiny step (kernels compiled or
loaded), builds the inputs and then obeys ``mem N`` / ``run N`` / ``quit`` on stdin
(N: torch threads; our Numba kernels follow torch's count). The main process:

* memory first, per worker: the worker's first full-size step, after resetting the
  peak RSS (``echo 5 > /proc/self/clear_refs``): ``VmHWM`` minus ``VmRSS`` just
  before the step, i.e. the peak memory above the inputs (the parameter gradients
  included). A fresh process per contender, and the first large step in it, so that
  no memory freed by an earlier step (and kept by the allocator) hides a peak. CUDA
  (``--device cuda``): ``torch.cuda.max_memory_allocated()`` minus the allocation
  before the step;
* then time, per thread count, in interleaved rounds (``--warmup`` untimed rounds,
  then ``--runs`` rounds, one step of every contender per round): medians, minima and
  the ratios to ``dense`` at the same thread count;
* the gradients: after its memory step each worker reports a fingerprint of the four
  gradients (norms, dot products with fixed random tensors), the table their largest
  relative difference from dense's ("grads vs dense").

Also: a scaling series over V and one over B T U (``--series``; time at the first
thread count, memory), drawn as a PNG (``--plot``, matplotlib), and the computed
memory figures at (B, T, U, J) = (32, 500, 100, 640), V = 1024 and 5000 (arithmetic).
Results go to ``--out`` as JSON lines.

Usage::

    python bench/joint_loss.py --quick                # small shapes: checks the script
    python bench/joint_loss.py                        # the two main shapes + series
    python bench/joint_loss.py --lattices standard --threads 1 --no-series
    python bench/joint_loss.py --anchor-python .anchors/bin/python
    python bench/joint_loss.py --device cuda --threads 1 --budget-s 90
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

Shape = Tuple[int, int, int, int, int]  # B, T, U (labels), J, V

SHAPES: List[Shape] = [(8, 300, 60, 320, 1024), (8, 300, 60, 320, 5000)]
V_SERIES: List[Shape] = [(4, 150, 40, 256, v) for v in (256, 512, 1024, 2048, 4096)]
NODE_SERIES: List[Shape] = [
    (2, 100, 20, 256, 1024),
    (4, 150, 40, 256, 1024),
    (8, 200, 50, 256, 1024),
    (8, 300, 60, 256, 1024),
]
QUICK_SHAPES: List[Shape] = [(2, 24, 5, 16, 40), (3, 20, 6, 16, 120)]
QUICK_V_SERIES: List[Shape] = [(2, 16, 4, 16, v) for v in (20, 40, 80)]
QUICK_NODE_SERIES: List[Shape] = [(1, 10, 3, 16, 40), (2, 16, 4, 16, 40)]
FIGURES = (32, 500, 100, 640)

LATTICES = {
    "standard": dict(big=(), tdt=None),
    "multiblank": dict(big=(2, 4, 8), tdt=None),
    "tdt": dict(big=(), tdt=(0, 1, 2, 3, 4)),
}
OURS = ("dense", "fused", "nemo-fused-batch")
ANCHORS = ("optimized_transducer", "k2-pruned")


# ------------------------------------------------------------------------- the steps
def blank_of(lattice: str, V: int) -> int:
    return V - 1 if LATTICES[lattice]["big"] else 0


def make_inputs(shape: Shape, lattice: str, device: str, seed: int = 0):
    """(enc, pred, weight, bias, labels, act_lens, label_lens) as leaves that require
    grad (the first four)."""
    import torch

    B, T, U, J, V = shape
    tdt = LATTICES[lattice]["tdt"]
    Vp = V + (len(tdt) if tdt else 0)
    gen = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, J, generator=gen)
    pred = torch.randn(B, U + 1, J, generator=gen)
    weight = torch.randn(Vp, J, generator=gen) / J**0.5
    bias = torch.randn(Vp, generator=gen) * 0.1
    if LATTICES[lattice]["big"]:  # the blanks are V - 4 .. V - 1
        labels = torch.randint(0, V - 4, (B, U), generator=gen)
    else:
        labels = torch.randint(1, V, (B, U), generator=gen)
    leaves = [x.to(device).requires_grad_(True) for x in (enc, pred, weight, bias)]
    lens = (torch.full((B,), T), torch.full((B,), U))
    return (*leaves, labels.to(device), *(x.to(device) for x in lens))


def _dense_loss(z, labels, act_lens, label_lens, lattice, reduction):
    from espnet_multiblank import multiblank_rnnt_loss, tdt_loss

    spec = LATTICES[lattice]
    blank = blank_of(lattice, z.shape[-1] - (len(spec["tdt"]) if spec["tdt"] else 0))
    if spec["tdt"]:
        return tdt_loss(
            z, labels, act_lens, label_lens, blank, spec["tdt"], reduction=reduction
        )
    return multiblank_rnnt_loss(
        z, labels, act_lens, label_lens, blank, spec["big"], reduction=reduction
    )


def _joint(enc, pred, weight, bias):
    """ESPnet's JointNetwork after its projections: lin_out(tanh(enc + pred))."""
    import torch

    h = torch.tanh(enc[:, :, None] + pred[:, None])
    return torch.nn.functional.linear(h, weight, bias)


def make_step(
    contender: str, lattice: str, x, sub_batch: int, tile_bytes, tile_backend="auto"
):
    """A zero-argument training step (forward + backward) returning the loss."""
    import torch

    enc, pred, weight, bias, labels, act_lens, label_lens = x
    spec = LATTICES[lattice]
    V = weight.shape[0] - (len(spec["tdt"]) if spec["tdt"] else 0)
    blank = blank_of(lattice, V)
    if contender in ANCHORS and lattice != "standard":
        raise NotImplementedError("standard RNN-T only")
    if contender == "dense":

        def step():
            z = _joint(enc, pred, weight, bias)
            loss = _dense_loss(z, labels, act_lens, label_lens, lattice, "mean")
            del z
            loss.backward()
            return loss

    elif contender == "fused":
        from espnet_multiblank import fused_transducer_loss

        def step():
            loss = fused_transducer_loss(
                enc,
                pred,
                weight,
                bias,
                labels,
                act_lens,
                label_lens,
                blank=blank,
                big_blank_durations=spec["big"],
                tdt_durations=spec["tdt"],
                tile_bytes=tile_bytes,
                tile_backend=tile_backend,
            )
            loss.backward()
            return loss

    elif contender == "nemo-fused-batch":

        def step():
            costs = []
            for lo in range(0, enc.shape[0], sub_batch):
                hi = min(lo + sub_batch, enc.shape[0])
                T_s = int(act_lens[lo:hi].max())
                U_s = int(label_lens[lo:hi].max())
                z = _joint(enc[lo:hi, :T_s], pred[lo:hi, : U_s + 1], weight, bias)
                costs.append(
                    _dense_loss(
                        z,
                        labels[lo:hi, :U_s],
                        act_lens[lo:hi],
                        label_lens[lo:hi],
                        lattice,
                        "none",
                    )
                )
                del z  # NeMo drops the joint; its graph keeps grads and hidden
            loss = torch.cat(costs).sum() / enc.shape[0]
            loss.backward()
            return loss

    elif contender == "optimized_transducer":
        import optimized_transducer

        def step():
            packed = []
            for b in range(enc.shape[0]):
                T_b, U_b = int(act_lens[b]), int(label_lens[b])
                z = _joint(
                    enc[b : b + 1, :T_b], pred[b : b + 1, : U_b + 1], weight, bias
                )
                packed.append(z.reshape(-1, z.shape[-1]))
            loss = optimized_transducer.transducer_loss(
                logits=torch.cat(packed),
                targets=labels.int(),
                logit_lengths=act_lens.int(),
                target_lengths=label_lens.int(),
                blank=blank,
                reduction="mean",
                from_log_softmax=False,
            )
            loss.backward()
            return loss

    elif contender == "k2-pruned":
        import fast_rnnt

        J = enc.shape[2]
        gen = torch.Generator().manual_seed(1)
        # the simple loss's own projections to the vocabulary (icefall's
        # simple_am_proj / simple_lm_proj), part of the step's parameters
        am_w = (torch.randn(V, J, generator=gen) / J**0.5).requires_grad_(True)
        lm_w = (torch.randn(V, J, generator=gen) / J**0.5).requires_grad_(True)
        B = enc.shape[0]
        boundary = torch.zeros(B, 4, dtype=torch.int64)
        boundary[:, 2] = label_lens
        boundary[:, 3] = act_lens
        symbols = labels.long()

        def step():
            simple, (px_grad, py_grad) = fast_rnnt.rnnt_loss_smoothed(
                lm=pred @ lm_w.t(),
                am=enc @ am_w.t(),
                symbols=symbols,
                termination_symbol=blank,
                lm_only_scale=0.25,
                am_only_scale=0.0,
                boundary=boundary,
                reduction="sum",
                return_grad=True,
            )
            ranges = fast_rnnt.get_rnnt_prune_ranges(
                px_grad=px_grad, py_grad=py_grad, boundary=boundary, s_range=5
            )
            am_p, lm_p = fast_rnnt.do_rnnt_pruning(am=enc, lm=pred, ranges=ranges)
            logits = torch.nn.functional.linear(torch.tanh(am_p + lm_p), weight, bias)
            pruned = fast_rnnt.rnnt_loss_pruned(
                logits=logits,
                symbols=symbols,
                ranges=ranges,
                termination_symbol=blank,
                boundary=boundary,
                reduction="sum",
            )
            loss = (0.5 * simple + pruned) / B
            loss.backward()
            return loss

    else:
        raise ValueError(f"unknown contender {contender!r}")

    def clean_step():
        for p in (enc, pred, weight, bias):
            p.grad = None
        return float(step().detach())

    return clean_step


# ------------------------------------------------------------------------ the worker
def grad_fingerprint(params) -> List[float]:
    """Per parameter (enc, pred, weight, bias): the float64 norm of its gradient and
    its dot product with a fixed random tensor (the same for every contender), so
    that the main process can tell whether two contenders' gradients agree."""
    import torch

    out = []
    for i, p in enumerate(params):
        g = p.grad.detach().double()
        gen = torch.Generator().manual_seed(1000 + i)
        probe = torch.randn(g.shape, generator=gen, dtype=torch.float64)
        out += [float(g.norm()), float((g * probe.to(g.device)).sum())]
    return out


def _peak_mb(step, device: str) -> Tuple[float, str, float]:
    """(peak MB above the memory before the step, method, loss)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20, "cuda", loss
    from loss_cpu import _reset_peak, _status_kb  # (bench/: the script's folder)

    if _reset_peak() and _status_kb("VmHWM") is not None:
        before = _status_kb("VmRSS")
        loss = step()
        return (_status_kb("VmHWM") - before) / 1024.0, "VmHWM after clear_refs", loss
    import resource

    before = _status_kb("VmRSS") or 0
    loss = step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak - before) / 1024.0, "ru_maxrss (only right for a new peak)", loss


def worker(spec: dict) -> None:
    """Run one contender on stdin's commands (module docstring); JSON lines out."""

    def say(**kw):
        print(json.dumps(kw), flush=True)

    try:
        import torch

        torch.set_num_threads(1)
        shape, lattice, device = tuple(spec["shape"]), spec["lattice"], spec["device"]
        tiny = (2, 8, 3, 8, shape[4] if shape[4] < 64 else 64)
        if device == "cuda":
            # the real J and V: the kernels compiled for them (the Triton blocks
            # and the CUDA loss's row layout depend on them) before the timed
            # steps; CUDA's peak counts allocated bytes, which a warm-up cannot hide
            tiny = (2, 8, 3, shape[3], shape[4])
        args = (spec["contender"], lattice)
        extra = (spec["sub_batch"], spec["tile_bytes"], spec.get("tile_backend"))
        make_step(*args, make_inputs(tiny, lattice, device), *extra)()  # warm up
        x = make_inputs(shape, lattice, device)
        step = make_step(*args, x, *extra)
    except Exception as e:  # noqa: BLE001 - any failure: reported, not run
        first = str(e).splitlines()[0][:120] if str(e) else ""
        say(unavailable=f"{type(e).__name__}: {first}")
        return
    say(ready=True)
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "quit":
            return
        torch.set_num_threads(int(rest[0]))
        try:
            if cmd == "mem":
                mb, method, loss = _peak_mb(step, device)
                say(mem_mb=mb, method=method, loss=loss, grads=grad_fingerprint(x[:4]))
            elif cmd == "run":
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = step()
                if device == "cuda":
                    torch.cuda.synchronize()
                say(s=time.perf_counter() - t0, loss=loss)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: reported
            say(error=f"{type(e).__name__}: {str(e)[:200]}")


class Worker:
    """A contender's worker process (the main side of the protocol)."""

    def __init__(self, name, contender, python, spec):
        self.name = name
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.error = None

    def wait_ready(self) -> None:
        """The worker's first answer (its start-up: imports, compilation, a tiny
        step); workers start in parallel, each is waited for here."""
        hello = self._read()
        self.error = hello.get("unavailable") or hello.get("error")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"worker exited (rc {self.proc.poll()})"}
        return json.loads(line)

    def ask(self, cmd: str, threads: int) -> dict:
        if self.error:
            return {"error": self.error}
        try:
            self.proc.stdin.write(f"{cmd} {threads}\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            return {"error": f"worker gone: {e}"}
        return self._read()

    def close(self):
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit 0\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001 - a stuck worker is killed
            self.proc.kill()


# ----------------------------------------------------------------------- the main run
def contenders(args) -> List[Tuple[str, str, Optional[int], str, str]]:
    """(row name, contender, tile_bytes, python, tile_backend) of this run."""
    out = [
        ("dense", "dense", None, sys.executable, "auto"),
        ("fused", "fused", None, sys.executable, "auto"),
    ]
    for tiles in args.fused_tile_backends:
        out.append((f"fused-{tiles}-tiles", "fused", None, sys.executable, tiles))
    for mib in args.fused_tiles:
        row = (f"fused-{mib}MiB", "fused", int(mib * 2**20), sys.executable, "auto")
        out.append(row)
    out.append(("nemo-fused-batch", "nemo-fused-batch", None, sys.executable, "auto"))
    if args.anchor_python:
        for a in ANCHORS:
            out.append((a, a, None, args.anchor_python, "auto"))
    if args.only:
        out = [c for c in out if c[0] == "dense" or c[0] in args.only]
    return out


def measure(shape: Shape, lattice: str, args, threads: List[int]) -> Dict[str, dict]:
    """Memory (first full step of each worker) and interleaved timing rounds."""
    rows = {}
    workers = []
    for name, contender, tile_bytes, python, tile_backend in contenders(args):
        if contender in ANCHORS and lattice != "standard":
            continue
        spec = dict(
            contender=contender,
            lattice=lattice,
            shape=list(shape),
            device=args.device,
            sub_batch=args.sub_batch,
            tile_bytes=tile_bytes,
            tile_backend=tile_backend,
        )
        workers.append(Worker(name, contender, python, spec))
    try:
        for w in workers:
            w.wait_ready()
        for w in workers:
            r = w.ask("mem", threads[0])
            rows[w.name] = {
                "mem_mb": r.get("mem_mb"),
                "mem_method": r.get("method"),
                "loss": r.get("loss"),
                "grads": r.get("grads"),
                "error": r.get("error"),
                "times": {n: [] for n in threads},
            }
        for n in threads:
            for rnd in range(args.warmup + args.runs):
                for w in workers:
                    row = rows[w.name]
                    if row["error"]:
                        continue
                    r = w.ask("run", n)
                    if "error" in r:
                        row["error"] = r["error"]
                    elif rnd >= args.warmup:
                        row["times"][n].append(r["s"])
    finally:
        for w in workers:
            w.close()
    return rows


def _median(ts):
    return statistics.median(ts) if ts else float("nan")


def grad_difference(got, want) -> Optional[float]:
    """The largest relative difference of two gradient fingerprints
    (:func:`grad_fingerprint`), each figure relative to the largest magnitude of its
    parameter's pair (None when either is missing)."""
    if not got or not want or len(got) != len(want):
        return None
    worst = 0.0
    for i in range(0, len(want), 2):
        scale = max(abs(want[i]), abs(want[i + 1]), 1e-30)
        for j in (i, i + 1):
            worst = max(worst, abs(got[j] - want[j]) / scale)
    return worst


def report(shape: Shape, lattice: str, rows: Dict[str, dict], threads, out) -> None:
    B, T, U, J, V = shape
    nodes = B * T * (U + 1)
    dense = rows.get("dense", {})
    print(
        f"\n(B,T,U,J,V) = {shape}, {lattice}: {nodes} nodes, dense logits "
        f"{nodes * (V + (5 if lattice == 'tdt' else 0)) * 4 / 2**20:.0f} MB"
    )
    head = f"  {'contender':<22} {'peak MB':>9} {'x dense':>8}"
    for n in threads:
        head += f" {f's ({n}t)':>9} {'x dense':>8} {'min x':>6}"
    print(head + f" {'loss':>12} {'grads vs dense':>14}")
    for name, row in rows.items():
        if row["error"]:
            print(f"  {name:<22} not run: {row['error']}")
            out.write(
                json.dumps(
                    dict(shape=shape, lattice=lattice, name=name, error=row["error"])
                )
                + "\n"
            )
            continue
        mem = row["mem_mb"]
        dmem = dense.get("mem_mb") or float("nan")
        line = f"  {name:<22} {mem:>9.1f} {mem / dmem:>8.3f}"
        rec = dict(
            shape=shape,
            lattice=lattice,
            name=name,
            mem_mb=mem,
            mem_method=row["mem_method"],
            loss=row["loss"],
            grads=row.get("grads"),
            grad_rel_diff=grad_difference(row.get("grads"), dense.get("grads")),
            times={},
        )
        for n in threads:
            ts = row["times"][n]
            dts = dense.get("times", {}).get(n) or []
            med = _median(ts)
            ratio = med / _median(dts) if dts else float("nan")
            rmin = min(ts) / min(dts) if ts and dts else float("nan")
            line += f" {med:>9.3f} {ratio:>8.3f} {rmin:>6.3f}"
            rec["times"][n] = ts
        diff = rec["grad_rel_diff"]
        diff_s = "n/a" if diff is None else f"{diff:.1e}"
        print(line + f" {row['loss']:>12.5f} {diff_s:>14}", flush=True)
        out.write(json.dumps(rec) + "\n")


def computed_figures(B, T, U, J, V_list=(1024, 5000)) -> None:
    """The memory arithmetic at a large shape (float32), printed."""
    nodes = B * T * (U + 1)
    mb = 2**20
    print(f"\ncomputed figures, float32, (B,T,U,J) = {(B, T, U, J)}: {nodes} nodes")
    print(f"  {'path':<66} " + " ".join(f"{f'V={v}':>13}" for v in V_list))

    def row(label, fn):
        cells = " ".join(f"{fn(v) / 2**30:>9.2f} GiB" for v in V_list)
        print(f"  {label:<66} {cells}")

    params = lambda v: (B * T * J + B * (U + 1) * J + v * J + v) * 4  # noqa: E731
    row("dense: logits + gradient buffer + hidden", lambda v: nodes * (2 * v + J) * 4)
    row(
        "nemo fused batch (8): grads + hidden, one sub-batch's logits",
        lambda v: nodes * (v + J) * 4 + nodes * 8 // B * v * 4,
    )
    for lattice, width in (("standard", 3), ("multiblank [2,4,8]", 6), ("tdt 0-4", 9)):
        lse = 2 if lattice.startswith("tdt") else 1
        row(
            f"fused {lattice}: planes + 4 MiB tile + gradients",
            lambda v, w=width, s=lse: nodes * (w + s) * 8 + 4 * mb + params(v),
        )
    row(
        "k2 pruned, s_range 5 (approximate): pruned logits, grads, hidden",
        lambda v: B * T * 5 * (2 * v + J) * 4 + params(v),
    )
    planes = " / ".join(f"{nodes * k * 8 / mb:.0f}" for k in (4, 7, 11))
    print(f"  (fused: the planes alone {planes} MiB for standard / [2,4,8] / TDT 0-4)")


_STYLES = {
    "dense": dict(linewidth=3.0, markersize=8),
    "nemo-fused-batch": dict(linestyle="--", markersize=4),
}


def _plain(y, _pos=None) -> str:
    """A log axis's major tick as a plain number (0.1, 1, 10, 1000)."""
    return f"{y:g}"


def plot(series: Dict[str, List[Tuple[Shape, Dict[str, dict]]]], path: str, thread):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError as e:
        print(f"\nno plot: matplotlib is not importable ({e})")
        return
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (key, xlabel, xval) in enumerate(
        (
            ("V", "V (vocabulary)", lambda s: s[4]),
            (
                "nodes",
                "B T (U + 1) (lattice nodes)",
                lambda s: s[0] * s[1] * (s[2] + 1),
            ),
        )
    ):
        points = series.get(key, [])
        names = sorted({n for _, rows in points for n in rows})
        for name in names:
            xs, mems, times = [], [], []
            for shape, rows in points:
                row = rows.get(name)
                if not row or row["error"] or not row["mem_mb"] > 0:
                    continue  # (log axes: a peak below the RSS resolution is left out)
                xs.append(xval(shape))
                mems.append(row["mem_mb"])
                times.append(_median(row["times"][thread]))
            if xs:
                # dense and nemo-fused-batch have the same peaks: dashed lines and
                # smaller markers keep the line drawn under another one visible
                style = dict(marker="o", label=name, **_STYLES.get(name, {}))
                axes[0, col].plot(xs, mems, **style)
                axes[1, col].plot(xs, times, **style)
        ticks = sorted({xval(shape) for shape, _ in points})
        axes[0, col].set_ylabel("peak memory above the inputs (MB)")
        axes[1, col].set_ylabel(f"step time (s, {thread} thread(s))")
        for ax in axes[:, col]:
            ax.set_xlabel(xlabel)
            ax.set_xscale("log")
            ax.set_yscale("log")
            # ticks at the measured x values, plain numbers, no minor tick labels
            # (matplotlib's "3x10^2 4x10^2" labels collide on a short log axis)
            ax.set_xticks(ticks, [f"{x:,}" for x in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_formatter(FuncFormatter(_plain))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("transducer joint + loss, one training step (float32)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="small shapes (checks the script)"
    )
    p.add_argument("--threads", default="1,2", help="torch thread counts (default 1,2)")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds (default 1)")
    p.add_argument("--lattices", default="standard,multiblank,tdt")
    p.add_argument(
        "--shape",
        action="append",
        default=None,
        help="B,T,U,J,V (repeatable): instead of the main shapes",
    )
    p.add_argument("--no-series", action="store_true", help="skip the scaling series")
    p.add_argument("--series-lattice", default="standard")
    p.add_argument("--sub-batch", type=int, default=8, help="NeMo fused batch size")
    p.add_argument("--fused-tiles", default="", help="extra fused tile sizes, MiB")
    p.add_argument(
        "--fused-tile-backends",
        default="",
        help="extra fused rows with these tile stages (torch, triton, numba)",
    )
    p.add_argument(
        "--only",
        default="",
        help="only these rows besides dense (comma-separated names, e.g. "
        "fused,fused-torch-tiles)",
    )
    p.add_argument(
        "--anchor-python",
        default=None,
        help="python of the anchor venv (default .anchors/bin/python if any)",
    )
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        help="start no new (shape, lattice) after this many seconds",
    )
    p.add_argument("--out", default="bench/out/joint_loss.jsonl")
    p.add_argument("--plot", default="bench/out/joint_loss.png")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.fused_tiles = [float(v) for v in args.fused_tiles.split(",") if v]
    args.fused_tile_backends = [v for v in args.fused_tile_backends.split(",") if v]
    args.only = [v for v in args.only.split(",") if v]
    if args.anchor_python is None:
        default = os.path.join(
            os.path.dirname(os.path.abspath(__file__)),
            "..",
            ".anchors",
            "bin",
            "python",
        )
        args.anchor_python = default if os.path.exists(default) else None
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return
    import torch

    threads = [int(v) for v in args.threads.split(",") if v]
    lattices = [v for v in args.lattices.split(",") if v]
    if args.shape:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape]
    else:
        shapes = QUICK_SHAPES if args.quick else SHAPES
    print(
        f"torch {torch.__version__}, device {args.device}, threads {threads}, "
        f"{args.runs} rounds after {args.warmup} warm-up, anchors: "
        f"{args.anchor_python or 'none (no --anchor-python, no .anchors venv)'}"
    )
    print(f"load average before: {_load()} ({os.cpu_count()} CPUs)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    t_start = time.time()
    skipped = []

    def run(shape, lattice, n_threads, out):
        if time.time() - t_start > args.budget_s:
            skipped.append(f"{shape} {lattice}")
            return None
        rows = measure(shape, lattice, args, n_threads)
        report(shape, lattice, rows, n_threads, out)
        return rows

    with open(args.out, "w") as out:
        for shape in shapes:
            for lattice in lattices:
                run(shape, lattice, threads, out)
        series = {}
        if not args.no_series:
            v_series = QUICK_V_SERIES if args.quick else V_SERIES
            n_series = QUICK_NODE_SERIES if args.quick else NODE_SERIES
            for key, shapes_ in (("V", v_series), ("nodes", n_series)):
                series[key] = []
                for shape in shapes_:
                    rows = run(shape, args.series_lattice, threads[:1], out)
                    if rows is not None:
                        series[key].append((shape, rows))
    if skipped:
        print(
            f"\nbudget of {args.budget_s:.0f} s spent; not run: " + "; ".join(skipped)
        )
    computed_figures(*FIGURES)
    if series:
        plot(series, args.plot, threads[0])
    print(f"\nload average after: {_load()}")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
