"""The fused joint + loss's CUDA step, profiled without a GPU: kernel launches, bytes
per tile and host synchronisations, counted (issue 40).

The CUDA paths run on CPU tensors: ``NUMBA_ENABLE_CUDASIM=1`` (the Numba CUDA lattice
and dense loss kernels simulated) and ``TRITON_INTERPRET=1`` (Triton kernels
interpreted), the lattice family's kernel for CPU tensors being its CUDA driver (as
in the tests' simulator). Paths (``--paths``):

* ``torch-tiles``: torch tile operations + the Numba CUDA lattice (the CUDA path as
  it ran on the H200, 0.061 s a step: ``tile_backend="torch"``);
* ``triton``: the Triton tile kernels + the Numba CUDA lattice (``"auto"`` on a GPU);
* ``dense``: materialised logits + the dense CUDA loss (for scale).

What is counted, over one training step (forward + backward; a first step runs
before, so that one-off work such as compilation and caches is not counted):

* **launches**: every aten operation that launches a kernel on a GPU (seen by a
  ``TorchDispatchMode``; views, bare allocations and other metadata operations left
  out), every Numba CUDA kernel (``launch.run_on_stream`` wrapped) and every Triton
  kernel (the kernels module wrapped);
* **bytes**: an aten operation's tensor operands and results (what it reads and
  writes if it touches each once); a Triton kernel's by construction (formulas in
  :func:`triton_bytes`);
* **host synchronisations**, what waits for the GPU on a real device: a copy to the
  host (``.cpu()``, ``.tolist()``, ``.numpy()`` of a device tensor, ``item`` / ``int``
  / ``bool`` of one: ``aten._local_scalar_dense``), an operation whose result's size
  depends on the data (``nonzero``, ``repeat_interleave`` without ``output_size``),
  and a copy from pageable host memory to the device (torch waits for those:
  ``.to(device)`` of a host tensor, ``torch.tensor(data, device=...)``). The loss
  package's checks of the lengths and labels run on the host for CPU tensors: they
  are counted as the 2 synchronisations they make on a GPU (the dense loss's
  too), their few small launches are not.

Per phase: the API's checks, forward set-up, forward tiles, lattice, the rest of
forward, backward set-up, backward tiles. Counts per tile come from a small batch of
many tiles (``--shape``, ``--tile-rows``); bytes per tile from ONE tile of the
issue's size (``--tile-shape``, the default CUDA tile of 32 MiB; the lattice there is
PyTorch's, which the tiles do not depend on). The step at the issue's shapes is then
``set-up + per-tile x tiles`` (its tiles from the same tiling).

Usage::

    python bench/fused_profile.py                    # every path, the three lattices
    python bench/fused_profile.py --paths triton --lattices tdt --json out.json
"""

import argparse
import json
import os
import sys
from collections import defaultdict

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

LATTICES = {
    "standard": dict(blank=0),
    "multiblank": dict(big_blank_durations=(2, 4, 8)),
    "tdt": dict(blank=0, tdt_durations=(0, 1, 2, 3, 4)),
}
PATHS = {
    "torch-tiles": dict(backend="numba", tile_backend="torch"),
    "triton": dict(backend="numba", tile_backend="triton"),
    "dense": None,
}
ISSUE_SHAPES = [(8, 300, 60, 320, 1024), (8, 300, 60, 320, 5000)]
CUDA_TILE_BYTES = 32 << 20

#: aten operations that launch no kernel on a GPU (views, bare allocations, metadata)
NO_LAUNCH = {
    "view",
    "_unsafe_view",
    "slice",
    "select",
    "t",
    "transpose",
    "expand",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "alias",
    "detach",
    "permute",
    "_reshape_alias",
    "reshape",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "lift_fresh",
    "split",
    "split_with_sizes",
    "unbind",
    "view_as",
    "set_",
    "_local_scalar_dense",
    "is_nonzero",
    "resolve_conj",
    "resolve_neg",
    "_to_copy_noop",
}
#: aten operations that wait for the device (a result's size from the data)
DATA_SIZED = {"nonzero", "masked_select", "unique", "_unique2"}


class Recorder(TorchDispatchMode):
    """Counts per phase: launches (by kind), bytes, host synchronisations."""

    def __init__(self):
        super().__init__()
        self.phase = "api"
        self.pass_ = "forward"
        self.tiles = defaultdict(int)
        self.launches = defaultdict(lambda: defaultdict(int))
        self.bytes = defaultdict(int)
        self.syncs = defaultdict(list)
        self.tile_bytes = defaultdict(lambda: defaultdict(int))
        self.first_tile_ops = defaultdict(list)
        self.ops = defaultdict(lambda: defaultdict(int))
        #: inside a kernel launch: the simulator's and the interpreter's own work
        #: (numpy views, storage copies) is not the step's
        self.quiet = False

    def launch(self, kind: str, name: str, nbytes: int = 0) -> None:
        self.launches[self.phase][kind] += 1
        self.bytes[self.phase] += nbytes
        if self.phase.endswith("tiles"):
            self.tile_bytes[self.pass_][self.tiles[self.pass_]] += nbytes
            if self.tiles[self.pass_] == 1:
                self.first_tile_ops[self.pass_].append((f"{kind}:{name}", nbytes))
        self.ops[self.phase][f"{kind}:{name}"] += 1

    def sync(self, what: str) -> None:
        if not self.quiet:
            self.syncs[self.phase].append(what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.quiet:
            return out
        name = func.overloadpacket.__name__
        if name in ("_local_scalar_dense", "is_nonzero"):
            self.sync(f"aten.{name}")
        elif name in DATA_SIZED:
            self.sync(f"aten.{name}")
        elif name == "repeat_interleave" and kwargs.get("output_size") is None:
            self.sync("aten.repeat_interleave without output_size")
        if name not in NO_LAUNCH:
            self.launch("aten", name, _nbytes(args) + _nbytes(out))
        return out


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def triton_bytes(name: str, a: dict) -> int:
    """What a Triton kernel reads and writes by construction (``a``: its arguments
    by name): the tile's z (R x V') or pre / d_pre (R x J) in their dtype, the
    per-row planes (float64) and the index (2 int64 per row)."""
    R = a["R"]
    idx = 16 * R
    if name in ("gather_pre", "scatter_pre_grad"):
        J = a["J"]
        s = (a["out_ptr"] if name == "gather_pre" else a["d_pre_ptr"]).element_size()
        if name == "gather_pre":
            return idx + 3 * R * J * s  # two rows read, one written
        return idx + 5 * R * J * s  # d_pre read; two atomic read-modify-writes
    z = a["z_ptr"]
    s = z.element_size()
    V, Vp = a["V"], a["Vp"]
    W, P = a["W"], a["P"]
    per_row = 32  # index (2 int64), label length, label
    if name == "extract_rows":
        # the token logits twice (max, then sum of exps), the durations once, the
        # picked logits; the row and lse written
        return R * (per_row + (2 * V + (Vp - V)) * s + 8 * (W + P))
    # apply_rows: z read and written, the row and lse read
    return R * (per_row + 2 * Vp * s + 8 * (W + P))


def _install(rec: Recorder):
    """Wrap the launch points and phase boundaries; returns an undo function."""
    from espnet_multiblank.fused import joint_loss, triton_kernels
    from espnet_multiblank.loss.cuda import launch as cuda_launch

    undo = []

    def patch(obj, name, new):
        old = getattr(obj, name)
        setattr(obj, name, new)
        undo.append(lambda: setattr(obj, name, old))
        return old

    # Triton kernels
    for kname in ("gather_pre", "extract_rows", "apply_rows", "scatter_pre_grad"):
        kernel = getattr(triton_kernels, kname)

        class Wrapped:
            def __init__(self, kernel, kname):
                self.kernel, self.kname = kernel, kname

            def __getitem__(self, grid):
                run = self.kernel[grid]
                kernel, kname = self.kernel, self.kname

                def call(*args, **kwargs):
                    named = dict(zip(kernel.arg_names, args))
                    named.update(kwargs)
                    rec.launch("triton", kname, triton_bytes(kname, named))
                    with _paused(rec):
                        return run(*args, **kwargs)

                return call

        patch(triton_kernels, kname, Wrapped(kernel, kname))

    # Numba CUDA kernels
    real_run = cuda_launch.run_on_stream

    def run_on_stream(dev, body):
        def counting(cfg):
            def cfg2(kernel, grid, block):
                launcher = cfg(kernel, grid, block)

                def call(*args):
                    rec.quiet = False
                    rec.launch("numba", getattr(kernel, "__name__", str(kernel)))
                    rec.quiet = True
                    return launcher(*args)

                return call

            return body(cfg2)

        # the kernels' arrays are numpy views in the simulator (no sync on a GPU)
        with _paused(rec):
            return real_run(dev, counting)

    patch(cuda_launch, "run_on_stream", run_on_stream)

    # phases
    fn = joint_loss.FusedJointLossFunction
    real_fwd, real_bwd = fn.forward, fn.backward

    def forward(ctx, *args):
        rec.pass_, rec.phase = "forward", "forward set-up"
        out = real_fwd(ctx, *args)
        rec.phase = "after"
        return out

    def backward(ctx, *args):
        rec.pass_, rec.phase = "backward", "backward set-up"
        out = real_bwd(ctx, *args)
        rec.phase = "after"
        return out

    patch(fn, "forward", staticmethod(forward))
    patch(fn, "backward", staticmethod(backward))
    real_tiles = joint_loss._tile_logits

    def tiles(*args, **kwargs):
        rec.phase = f"{rec.pass_} tiles"
        it = real_tiles(*args, **kwargs)
        while True:
            rec.tiles[rec.pass_] += 1  # what runs from here on is that tile's
            try:
                item = next(it)
            except StopIteration:
                rec.tiles[rec.pass_] -= 1
                break
            yield item
        rec.phase = f"{rec.pass_} rest"

    patch(joint_loss, "_tile_logits", tiles)
    real_lattice = joint_loss.run_lattice

    def lattice(*args, **kwargs):
        rec.phase = "lattice"
        out = real_lattice(*args, **kwargs)
        rec.phase = "forward rest"
        return out

    patch(joint_loss, "run_lattice", lattice)

    # the loss package's checks of lengths and labels run on the host for CPU
    # tensors; on a GPU they are torch operations with two .tolist() (shared with
    # the dense loss): counted as those two synchronisations, their few small
    # launches not
    from espnet_multiblank.loss import validation

    real_host_checks = validation._check_on_host

    def host_checks(*args, **kwargs):
        rec.sync("input checks' flags .tolist() (on a GPU)")
        rec.sync("input checks' flags .tolist() (on a GPU)")
        with _paused(rec):
            return real_host_checks(*args, **kwargs)

    patch(validation, "_check_on_host", host_checks)

    # host synchronisations at the Python level (host tensors are tagged)
    def tag(t):
        t._profile_host = True
        return t

    def is_host(t):
        return getattr(t, "_profile_host", False)

    real_cpu, real_numpy = torch.Tensor.cpu, torch.Tensor.numpy
    real_tolist, real_to = torch.Tensor.tolist, torch.Tensor.to
    real_from_numpy, real_tensor = torch.from_numpy, torch.tensor

    def cpu(self, *a, **k):
        if not is_host(self):
            rec.sync("Tensor.cpu")
        return tag(real_cpu(self, *a, **k))

    def numpy(self, *a, **k):
        if not is_host(self):
            rec.sync("Tensor.numpy")
        return real_numpy(self, *a, **k)

    def tolist(self):
        if not is_host(self):
            rec.sync("Tensor.tolist")
        return real_tolist(self)

    def to(self, *a, **k):
        device = k.get("device") or next(
            (v for v in a if isinstance(v, (str, torch.device))), None
        )
        out = real_to(self, *a, **k)
        if device is not None and is_host(self):
            rec.sync("host-to-device copy (Tensor.to)")
            if out is self:  # an untagged alias: a device tensor now
                out = out.view_as(out)
        return out

    def from_numpy(x):
        return tag(real_from_numpy(x))

    def tensor(data, *a, **k):
        if k.get("device") is not None and not isinstance(data, torch.Tensor):
            rec.sync("host-to-device copy (torch.tensor)")
        return real_tensor(data, *a, **k)

    patch(torch.Tensor, "cpu", cpu)
    patch(torch.Tensor, "numpy", numpy)
    patch(torch.Tensor, "tolist", tolist)
    patch(torch.Tensor, "to", to)
    patch(torch, "from_numpy", from_numpy)
    patch(torch, "tensor", tensor)

    def restore():
        for u in reversed(undo):
            u()

    return restore


class _paused:
    """Nothing inside a kernel launch is recorded (the simulator and the
    interpreter run torch operations of their own)."""

    def __init__(self, rec):
        self.rec = rec

    def __enter__(self):
        self.saved = self.rec.quiet
        self.rec.quiet = True

    def __exit__(self, *exc):
        self.rec.quiet = self.saved


def route_cpu_to_cuda_kernels() -> None:
    """CPU tensors get the lattice family's CUDA driver (the simulator's)."""
    from espnet_multiblank.loss.families import LatticeFamily

    original = LatticeFamily.kernel

    def kernel(self, device):
        return self.cuda_driver() if device.type == "cpu" else original(self, device)

    LatticeFamily.kernel = kernel


def make_inputs(shape, lattice, seed=0):
    B, T, U, J, V = shape
    D = len(LATTICES[lattice].get("tdt_durations", ()))
    gen = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, J, generator=gen).requires_grad_(True)
    pred = torch.randn(B, U + 1, J, generator=gen).requires_grad_(True)
    w = (torch.randn(V + D, J, generator=gen) / J**0.5).requires_grad_(True)
    b = (0.1 * torch.randn(V + D, generator=gen)).requires_grad_(True)
    lo = 4 if lattice == "multiblank" else 1
    labels = torch.randint(lo, V, (B, U), generator=gen)
    act_lens = torch.full((B,), T, dtype=torch.int64)
    label_lens = torch.full((B,), U, dtype=torch.int64)
    return enc, pred, w, b, labels, act_lens, label_lens


def step(path, lattice, x, tile_bytes, backend=None):
    from espnet_multiblank import fused_transducer_loss, multiblank_rnnt_loss, tdt_loss

    opts = dict(LATTICES[lattice])
    if lattice == "multiblank":
        opts["blank"] = x[2].shape[0] - 1
    if path == "dense":
        enc, pred, w, b, labels, al, ll = x
        z = torch.nn.functional.linear(
            torch.tanh(enc[:, :, None] + pred[:, None]), w, b
        )
        if "tdt_durations" in opts:
            loss = tdt_loss(z, labels, al, ll, durations=opts["tdt_durations"], blank=0)
        else:
            loss = multiblank_rnnt_loss(z, labels, al, ll, **opts)
    else:
        kw = dict(PATHS[path])
        if backend is not None:
            kw["backend"] = backend
        loss = fused_transducer_loss(*x, tile_bytes=tile_bytes, **opts, **kw)
    loss.backward()
    return loss


def tile_bytes_for_rows(rows, shape, lattice) -> int:
    """tile_bytes that gives tiles of ``rows`` rows (float32)."""
    D = len(LATTICES[lattice].get("tdt_durations", ()))
    return rows * (shape[4] + D + 3 * shape[3]) * 4


def profile(path, lattice, shape, tile_bytes, backend=None, gpu_blocks=False):
    """Counts of one step (after a first, uncounted one); ``gpu_blocks``: the
    Triton kernels with a GPU's blocks (the interpreter's tiny ones would take
    hours at the issue's tile size)."""
    from espnet_multiblank.fused import triton_tile_ops as tto

    real_blocks = tto.blocks_for
    if gpu_blocks:
        tto.blocks_for = tto.gpu_blocks
    try:
        return _profile(path, lattice, shape, tile_bytes, backend)
    finally:
        tto.blocks_for = real_blocks


def _profile(path, lattice, shape, tile_bytes, backend):
    step(path, lattice, make_inputs(shape, lattice), tile_bytes, backend)
    x = make_inputs(shape, lattice, seed=1)
    rec = Recorder()
    restore = _install(rec)
    try:
        with rec:
            step(path, lattice, x, tile_bytes, backend)
    finally:
        restore()
    return rec


def summary(rec: Recorder) -> dict:
    phases = {}
    for phase in sorted(set(rec.launches) | set(rec.syncs)):
        phases[phase] = {
            "launches": dict(rec.launches[phase]),
            "bytes": rec.bytes[phase],
            "syncs": list(rec.syncs[phase]),
            "ops": dict(rec.ops[phase]),
        }
    first = {k: v.get(1, 0) for k, v in rec.tile_bytes.items()}
    return {
        "tiles": dict(rec.tiles),
        "phases": phases,
        "first_tile_bytes": first,
        "first_tile_ops": dict(rec.first_tile_ops),
    }


def issue_tiles(shape, lattice) -> int:
    """Tiles of the issue's shape at the default CUDA tile (float32)."""
    B, T, U, J, V = shape
    D = len(LATTICES[lattice].get("tdt_durations", ()))
    rows = max(1, CUDA_TILE_BYTES // ((V + D + 3 * J) * 4))
    return -(-(B * T * (U + 1)) // rows)


def _total(d: dict) -> int:
    return sum(d.values())


def report(path, lattice, small: dict, big: dict, out: dict) -> None:
    ph = small["phases"]
    tiles = small["tiles"]
    per_tile = {}
    fixed_launches, fixed_syncs = 0, 0
    print(f"\n{path}, {lattice}: {tiles} tiles in the counted step")
    print(f"  {'phase':<18} {'launches':>9} {'syncs':>6}  what")
    for name, p in ph.items():
        n = _total(p["launches"])
        s = len(p["syncs"])
        pass_ = name.split()[0]
        if name.endswith("tiles") and tiles.get(pass_):
            per_tile[pass_] = (n / tiles[pass_], s / tiles[pass_])
            label = f"{name} /tile"
            n_show, s_show = n / tiles[pass_], s / tiles[pass_]
        else:
            fixed_launches += n
            fixed_syncs += s
            label, n_show, s_show = name, n, s
        what = ", ".join(f"{k} {v}" for k, v in sorted(p["ops"].items()))
        syncs = "; ".join(sorted(set(p["syncs"])))
        print(f"  {label:<18} {n_show:>9.1f} {s_show:>6.1f}  {what[:150]}")
        if syncs:
            print(f"  {'':<18} {'':>9} {'':>6}  syncs: {syncs}")
    row = {"path": path, "lattice": lattice, "small": small, "tile": big}
    if path != "dense":
        first = big.get("first_tile_bytes", {})
        f_bytes, b_bytes = first.get("forward", 0), first.get("backward", 0)
        print(
            f"  one tile at the issue's size: forward {f_bytes / 2**20:.1f} MiB, "
            f"backward {b_bytes / 2**20:.1f} MiB read + written"
        )
        row["tile_mib"] = {"forward": f_bytes / 2**20, "backward": b_bytes / 2**20}
        for pass_, ops in big.get("first_tile_ops", {}).items():
            listed = ", ".join(f"{n} {b / 2**20:.1f}" for n, b in ops)
            print(f"    {pass_} (MiB): {listed}")
        row["issue"] = []
        for shape in ISSUE_SHAPES:
            n = issue_tiles(shape, lattice)
            launches = fixed_launches + n * sum(v[0] for v in per_tile.values())
            syncs = fixed_syncs + n * sum(v[1] for v in per_tile.values())
            print(
                f"  at {shape}: {n} tiles -> {launches:.0f} launches, {syncs:.0f} "
                "host syncs a step"
            )
            row["issue"].append(
                {"shape": shape, "tiles": n, "launches": launches, "syncs": syncs}
            )
    out.setdefault("rows", []).append(row)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paths", default="torch-tiles,triton,dense")
    p.add_argument("--lattices", default="standard,multiblank,tdt")
    p.add_argument("--shape", default="2,9,3,16,40", help="B,T,U,J,V of the counts")
    p.add_argument("--tile-rows", type=int, default=7, help="rows per tile (counts)")
    p.add_argument(
        "--tile-shape",
        default="1,70,60,320,1024",
        help="B,T,U,J,V of the one-tile bytes run ('' skips it)",
    )
    p.add_argument("--json", default=None, help="write the counts here")
    args = p.parse_args(argv)
    import numba  # noqa: F401  (the simulator, before the package's CUDA code)

    from espnet_multiblank.fused import triton_tile_ops

    assert triton_tile_ops.interpreting()
    route_cpu_to_cuda_kernels()
    shape = tuple(int(v) for v in args.shape.split(","))
    tile_shape = (
        tuple(int(v) for v in args.tile_shape.split(",")) if args.tile_shape else None
    )
    out = {"shape": shape, "tile_shape": tile_shape}
    for lattice in args.lattices.split(","):
        for path in args.paths.split(","):
            tb = tile_bytes_for_rows(args.tile_rows, shape, lattice)
            small = summary(profile(path, lattice, shape, tb))
            big = {"phases": {}, "tiles": {}}
            if tile_shape and path != "dense":
                # one default CUDA tile (and a remainder), the PyTorch lattice
                rec = profile(path, lattice, tile_shape, CUDA_TILE_BYTES, "torch", True)
                big = summary(rec)
            report(path, lattice, small, big, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
