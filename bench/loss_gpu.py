"""GPU benchmark of the multi-blank RNN-T and TDT losses: time and peak memory, side by
side in ONE process.

For every (B, T, U, V), loss and logits dtype:

- ``ours``: this package's CUDA kernels (``backend="numba"``), forward + backward
  w.r.t. the logits (incoming gradient 1);
- ``ours x0.7``: the same with ``(0.7 * loss).backward()`` (an incoming gradient != 1,
  folded into the gradient kernel: same time, same single gradient buffer expected);
- ``espnet`` (standard and multi-blank only): ESPnet 202511's Numba CUDA loss on the
  same logits (``RNNTLossNumba`` / ``MultiblankRNNTLossNumba``), int32 labels/lengths
  as it requires; when it fails on the dtype (bf16) it runs on a float32 upcast made
  inside the timed region and is marked ``espnet(f32)``;
- ``torch``: this package's PyTorch backend, only where the logits have at most
  --torch-max-elems elements;
- yardsticks on the same logits: a device-to-device copy (one read + one write: the
  bandwidth floor) and one ``torch.log_softmax`` (output allocated by torch).

Losses (``--losses``): ``rnnt`` (standard, blank 0), ``mb:2,4,8`` (multi-blank, blank N
so that big blank i is index N - 1 - i, ESPnet's vocabulary layout, sigma 0.05) and
``tdt:0,1,2,3,4`` (TDT: logits (B, T, U, V + D), blank 0, sigma 0.05; the yardsticks
run over those V + D-wide logits). Labels random non-blank tokens, full lengths
(ESPnet requires T = max T_b), reduction "sum".

Every row prints its time as a ratio to the log_softmax (``t/lsm``) and to the copy
(``t/copy``) of the same logits. An exact loss reads the logits twice (row
statistics, gradient) and writes the gradient once, so ~1.5x the copy is the floor.

Timing: CUDA events around forward + backward, median of --repeats after --warmup
runs. Memory: ``torch.cuda.max_memory_allocated()`` minus the allocation before the
run (the logits excluded, the gradient included), from one extra run. ``--budget-s``:
no new configuration starts after that many seconds (the rest is reported skipped),
so that the run fits a lent GPU's time.

Usage::

    python bench/loss_gpu.py [--shapes 32,188,91,1024 8,500,150,1024]
        [--losses rnnt mb:2,4,8 tdt:0,1,2,3,4] [--dtypes float32 bfloat16]
        [--budget-s 200] [--out results.jsonl]
"""

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the anchor shape first: a budget cut keeps the most informative rows
DEFAULT_SHAPES = [
    "32,188,91,1024",
    "8,500,150,1024",
    "16,100,20,64",
    "4,150,40,128",
    "32,100,30,500",
    "16,300,60,4096",
]
DEFAULT_LOSSES = ["rnnt", "mb:2,4,8", "tdt:0,1,2,3,4"]


def _sync():
    torch.cuda.synchronize()


def measure(fn, warmup: int, repeats: int):
    """(median seconds, peak extra bytes) of ``fn()`` on the GPU.

    ``fn`` must release what it allocates (the gradient is dropped by the caller's
    closure). The peak is taken over one extra run after the timed ones.
    """
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    gc.collect()
    _sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    _sync()
    peak = torch.cuda.max_memory_allocated() - base
    return statistics.median(times), peak


def parse_loss(spec: str):
    """("rnnt" | "mb" | "tdt", durations tuple)."""
    kind, _, rest = spec.partition(":")
    durations = tuple(int(d) for d in rest.split(",") if d)
    if kind not in ("rnnt", "mb", "tdt") or (kind != "rnnt" and not durations):
        raise SystemExit(f"bad --losses entry {spec!r} (rnnt, mb:2,4,8, tdt:0,1,2)")
    return kind, durations


def make_batch(B, T, U, V, kind, durations, dtype, seed=0):
    """logits (B, T, U, V [+ D for TDT]), labels (B, U - 1) non-blank, lengths."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = V + (len(durations) if kind == "tdt" else 0)
    acts = torch.randn(
        (B, T, U, width), device="cuda", dtype=torch.float32, generator=g
    )
    acts = acts.to(dtype)
    lo = len(durations) + 1 if kind == "mb" else 1
    labels = torch.randint(lo, V, (B, U - 1), device="cuda", generator=g)
    tl = torch.full((B,), T, dtype=torch.int64, device="cuda")
    ll = torch.full((B,), U - 1, dtype=torch.int64, device="cuda")
    return acts, labels, tl, ll


def loss_fn(name, kind, durations, acts, labels, tl, ll):
    """A closure running forward + backward once; returns (closure, label)."""
    sigma = 0.0 if kind == "rnnt" else 0.05
    if name in ("ours", "ours x0.7", "torch"):
        backend = "torch" if name == "torch" else "numba"
        scale = 0.7 if name == "ours x0.7" else None
        if kind == "tdt":
            from espnet_multiblank import tdt_loss

            def loss_of(x):
                return tdt_loss(
                    x,
                    labels,
                    tl,
                    ll,
                    0,
                    durations,
                    reduction="sum",
                    sigma=sigma,
                    backend=backend,
                )

        else:
            from espnet_multiblank.loss import multiblank_rnnt_loss

            blank = len(durations)

            def loss_of(x):
                return multiblank_rnnt_loss(
                    x,
                    labels,
                    tl,
                    ll,
                    blank,
                    durations,
                    "sum",
                    sigma=sigma,
                    backend=backend,
                )

        def run():
            x = acts.detach().requires_grad_(True)
            loss = loss_of(x)
            (loss if scale is None else loss * scale).backward()
            return loss.detach()

        return run, name

    # ESPnet
    from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import (
        MultiblankRNNTLossNumba,
        RNNTLossNumba,
    )

    if kind == "mb":
        mod = MultiblankRNNTLossNumba(
            len(durations), list(durations), "sum", sigma=sigma
        )
    else:
        mod = RNNTLossNumba(blank=0, reduction="sum")
    labels32, tl32, ll32 = labels.int(), tl.int(), ll.int()

    def run_native():
        x = acts.detach().requires_grad_(True)
        loss = mod(x, labels32, tl32, ll32)
        loss.sum().backward()
        return loss.detach().sum()

    def run_upcast():
        x = acts.detach().requires_grad_(True)
        loss = mod(x.float(), labels32, tl32, ll32)
        loss.sum().backward()
        return loss.detach().sum()

    if acts.dtype == torch.float32:
        return run_native, name
    try:
        v = run_native()
        _sync()
        if torch.isfinite(v):
            return run_native, name
        reason = f"non-finite loss {float(v)}"
    except Exception as e:  # ESPnet's bf16 workspace
        reason = f"{type(e).__name__}: {str(e)[:120]}"
    print(f"    espnet on {acts.dtype} failed ({reason}); timing it on a f32 upcast")
    return run_upcast, "espnet(f32)"


def yardsticks(acts, warmup, repeats):
    out = torch.empty_like(acts)

    def copy():
        out.copy_(acts)

    t_copy, _ = measure(copy, warmup, repeats)
    out = None  # free the copy target before the next measurement

    def lsm():
        torch.log_softmax(acts, dim=-1)

    t_lsm, _ = measure(lsm, warmup, repeats)
    return t_copy, t_lsm


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    p.add_argument("--losses", nargs="+", default=DEFAULT_LOSSES)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--torch-max-elems", type=float, default=4e6)
    p.add_argument("--no-espnet", action="store_true")
    p.add_argument("--budget-s", type=float, default=float("inf"))
    p.add_argument("--out", default=None, help="append one JSON line per config")
    args = p.parse_args(argv)
    t_start = time.time()

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark")
        return 0
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    try:
        import numba
        import numba_cuda

        print(f"numba {numba.__version__}  numba-cuda {numba_cuda.__version__}")
    except ImportError as e:
        print(f"numba-cuda missing: {e}")
    out_f = open(args.out, "a") if args.out else None
    header = (
        f"{'B,T,U,V':>16} {'loss':>14} {'dtype':>8} {'contender':>12} "
        f"{'time ms':>9} {'peak GB':>8} {'t/lsm':>6} {'t/copy':>7} {'vs espnet':>9} "
        f"{'mem/esp':>8} {'loss value':>14}"
    )
    print(header)
    configs = [
        (shape, spec, dtype_name)
        for shape in args.shapes
        for spec in args.losses
        for dtype_name in args.dtypes
    ]
    for i, (shape, spec, dtype_name) in enumerate(configs):
        if time.time() - t_start > args.budget_s:
            left = [f"{s} {l} {d}" for s, l, d in configs[i:]]
            print(f"budget of {args.budget_s:.0f} s spent; skipped: " + "; ".join(left))
            break
        B, T, U, V = (int(s) for s in shape.split(","))
        kind, durations = parse_loss(spec)
        dtype = getattr(torch, dtype_name)
        gc.collect()
        torch.cuda.empty_cache()
        acts, labels, tl, ll = make_batch(B, T, U, V, kind, durations, dtype)
        logits_gb = acts.numel() * acts.element_size() / 1e9
        t_copy, t_lsm = yardsticks(acts, args.warmup, args.repeats)
        names = ["ours", "ours x0.7"]
        if not args.no_espnet and kind != "tdt":
            names.append("espnet")
        if acts.numel() <= args.torch_max_elems:
            names.append("torch")
        res = {}
        for name in names:
            try:
                t0 = time.time()
                fn, label = loss_fn(name, kind, durations, acts, labels, tl, ll)
                value = float(fn())
                first = time.time() - t0  # includes JIT compilation
                t, peak = measure(fn, args.warmup, args.repeats)
                res[name] = dict(
                    label=label, time=t, peak=peak, loss=value, first_s=first
                )
            except Exception as e:
                res[name] = dict(label=name, error=f"{type(e).__name__}: {e}")
            gc.collect()
            torch.cuda.empty_cache()
        esp = res.get("espnet", {})
        for name in names:
            r = res[name]
            lead = f"{shape:>16} {spec:>14} {dtype_name:>8} {r['label']:>12}"
            if "error" in r:
                print(f"{lead} ERROR {r['error'][:200]}")
                continue
            vs = (r["time"] / esp["time"]) if "time" in esp else float("nan")
            mem = (r["peak"] / esp["peak"]) if esp.get("peak") else float("nan")
            print(
                f"{lead} {r['time'] * 1e3:9.2f} {r['peak'] / 1e9:8.3f} "
                f"{r['time'] / t_lsm:6.2f} {r['time'] / t_copy:7.2f} "
                f"{vs:9.2f} {mem:8.2f} {r['loss']:14.6g}"
            )
        if "loss" in res.get("ours", {}) and "loss" in esp:
            a, b = res["ours"]["loss"], esp["loss"]
            print(
                f"{'':>16} |loss ours - espnet| / |espnet| = "
                f"{abs(a - b) / max(abs(b), 1e-30):.2e}"
            )
        print(
            f"{'':>16} logits {logits_gb:.3f} GB; copy {t_copy * 1e3:.2f} ms "
            f"({2 * logits_gb / t_copy:.0f} GB/s r+w); log_softmax "
            f"{t_lsm * 1e3:.2f} ms; first call of ours "
            f"{res.get('ours', {}).get('first_s', float('nan')):.1f} s (with JIT)"
        )
        if out_f:
            rec = dict(
                shape=[B, T, U, V],
                loss=spec,
                dtype=dtype_name,
                logits_gb=logits_gb,
                copy_s=t_copy,
                log_softmax_s=t_lsm,
                results=res,
            )
            out_f.write(json.dumps(rec) + "\n")
            out_f.flush()
        del acts, labels, tl, ll
    print(f"total {time.time() - t_start:.0f} s")
    if out_f:
        out_f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
