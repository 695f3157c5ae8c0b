"""GPU benchmark of the multi-blank RNN-T loss: time and peak memory, side by side.

For every (B, T, U, V), duration set and logits dtype, in ONE process:

- ``ours``: ``multiblank_rnnt_loss(..., backend="numba")`` (this package's CUDA
  kernels), forward + backward w.r.t. the logits;
- ``espnet``: ESPnet 202511's Numba CUDA loss on the same logits
  (``MultiblankRNNTLossNumba``, or ``RNNTLossNumba`` when there is no big blank), with
  int32 labels/lengths as it requires; when it fails on the dtype (bf16) it is run on
  a float32 upcast made inside the timed region and marked ``espnet(f32)``;
- ``torch``: this package's PyTorch backend, only where B*T*U*V <= --torch-max-elems;
- yardsticks: a device-to-device copy of the logits (one read + one write: the
  bandwidth floor) and ``torch.log_softmax`` over them.

Timing: CUDA events around forward + backward, median of --repeats after --warmup
runs. Memory: ``torch.cuda.max_memory_allocated()`` minus the allocation before the
run (the logits themselves excluded, the gradient included). Full lengths (ESPnet
requires T = max T_b), labels random in [N + 1, V), blank = N so that big blank i is
index N - 1 - i (ESPnet's vocabulary layout), sigma 0.05 when N > 0.

Usage::

    python bench/loss_gpu.py [--shapes 32,188,91,1024 8,500,150,1024]
        [--durations "" 2,4,8] [--dtypes float32 bfloat16] [--out results.jsonl]
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

DEFAULT_SHAPES = ["4,150,40,128", "32,188,91,1024", "8,500,150,1024", "16,300,60,4096"]


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


def make_batch(B, T, U, V, n_big, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    acts = torch.randn((B, T, U, V), device="cuda", dtype=torch.float32, generator=g)
    acts = acts.to(dtype)
    labels = torch.randint(n_big + 1, V, (B, U - 1), device="cuda", generator=g)
    tl = torch.full((B,), T, dtype=torch.int64, device="cuda")
    ll = torch.full((B,), U - 1, dtype=torch.int64, device="cuda")
    return acts, labels, tl, ll


def loss_fn(backend_name, acts, labels, tl, ll, durations, sigma):
    """A closure running forward + backward once; returns (closure, label)."""
    n_big = len(durations)
    blank = n_big
    label = backend_name
    if backend_name in ("ours", "torch"):
        from espnet_multiblank.loss import multiblank_rnnt_loss

        backend = "numba" if backend_name == "ours" else "torch"

        def run():
            x = acts.detach().requires_grad_(True)
            loss = multiblank_rnnt_loss(
                x, labels, tl, ll, blank, durations, "sum", sigma=sigma, backend=backend
            )
            loss.backward()
            return loss.detach()

        return run, label

    # ESPnet
    from espnet2.asr.transducer.rnnt_multi_blank.rnnt_multi_blank import (
        MultiblankRNNTLossNumba,
        RNNTLossNumba,
    )

    if n_big:
        mod = MultiblankRNNTLossNumba(blank, list(durations), "sum", sigma=sigma)
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
        return run_native, label
    try:
        v = run_native()
        _sync()
        if torch.isfinite(v):
            return run_native, label
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
    p.add_argument("--durations", nargs="+", default=["", "2,4,8"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--torch-max-elems", type=float, default=4e6)
    p.add_argument("--no-espnet", action="store_true")
    p.add_argument("--out", default=None, help="append one JSON line per config")
    args = p.parse_args(argv)

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
        f"{'B,T,U,V':>18} {'N':>5} {'dtype':>8} {'backend':>12} {'time ms':>9} "
        f"{'peak GB':>8} {'t/copy':>7} {'t/lsm':>6} {'vs espnet':>9} {'mem/esp':>8} "
        f"{'loss':>14}"
    )
    print(header)
    for shape in args.shapes:
        B, T, U, V = (int(s) for s in shape.split(","))
        for dur_s in args.durations:
            durations = tuple(int(d) for d in dur_s.split(",") if d)
            sigma = 0.05 if durations else 0.0
            for dtype_name in args.dtypes:
                dtype = getattr(torch, dtype_name)
                gc.collect()
                torch.cuda.empty_cache()
                acts, labels, tl, ll = make_batch(B, T, U, V, len(durations), dtype)
                logits_gb = acts.numel() * acts.element_size() / 1e9
                t_copy, t_lsm = yardsticks(acts, args.warmup, args.repeats)
                backends = ["ours"]
                if not args.no_espnet:
                    backends.append("espnet")
                if B * T * U * V <= args.torch_max_elems:
                    backends.append("torch")
                res = {}
                for name in backends:
                    try:
                        t0 = time.time()
                        fn, label = loss_fn(
                            name, acts, labels, tl, ll, durations, sigma
                        )
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
                for name in backends:
                    r = res[name]
                    if "error" in r:
                        print(
                            f"{shape:>18} {len(durations):>5} {dtype_name:>8} "
                            f"{r['label']:>12} ERROR {r['error'][:200]}"
                        )
                        continue
                    vs = (r["time"] / esp["time"]) if "time" in esp else float("nan")
                    mem = (r["peak"] / esp["peak"]) if esp.get("peak") else float("nan")
                    print(
                        f"{shape:>18} {len(durations):>5} {dtype_name:>8} "
                        f"{r['label']:>12} {r['time'] * 1e3:9.2f} "
                        f"{r['peak'] / 1e9:8.2f} "
                        f"{r['time'] / t_copy:7.2f} {r['time'] / t_lsm:6.2f} "
                        f"{vs:9.2f} {mem:8.2f} {r['loss']:14.6g}"
                    )
                if "loss" in res.get("ours", {}) and "loss" in esp:
                    a, b = res["ours"]["loss"], esp["loss"]
                    print(
                        f"{'':>18} |loss ours - espnet| / |espnet| = "
                        f"{abs(a - b) / max(abs(b), 1e-30):.2e}"
                    )
                print(
                    f"{'':>18} logits {logits_gb:.2f} GB; copy {t_copy * 1e3:.2f} ms "
                    f"({2 * logits_gb / t_copy:.0f} GB/s r+w); log_softmax "
                    f"{t_lsm * 1e3:.2f} ms"
                )
                if out_f:
                    rec = dict(
                        shape=[B, T, U, V],
                        durations=list(durations),
                        dtype=dtype_name,
                        logits_gb=logits_gb,
                        copy_s=t_copy,
                        log_softmax_s=t_lsm,
                        results=res,
                    )
                    out_f.write(json.dumps(rec) + "\n")
                    out_f.flush()
                del acts, labels, tl, ll
    if out_f:
        out_f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
