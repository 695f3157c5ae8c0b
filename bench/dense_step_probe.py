"""Probe: where the dense joint + loss step's time goes (CPU), and what an idle gap
before a step costs.

A diagnostic for bench/RESULTS.md (issue 26, "The dense standard step"), not a
contender of ``joint_loss.py``. One process, one lattice, the dense step of
``joint_loss.py`` (``tanh(enc + pred) @ W^T + b``, then ``multiblank_rnnt_loss``,
reduction "mean", 1 torch thread), timed stage by stage with the process's CPU time
(user + system) and its system time alone:

* ``joint fwd``: ``tanh(enc[:, :, None] + pred[:, None])`` and the output layer;
* ``loss fwd`` / ``loss bwd``: our loss's forward (passes 1 and 2; the gradient
  buffer allocated and first touched here) and its backward (pass 3);
* ``joint bwd``: autograd through the output layer and the tanh.

``--gap S``: every other step is preceded by S seconds of sleep. On a virtual machine
whose guest reports free memory to the host (virtio-balloon free page reporting,
``/sys/module/page_reporting/parameters/reported_kib``), memory freed by the previous
step and left idle for more than about 2 s is given back to the host, and touching it
again costs more system time. The MiB reported during each gap are printed.

Usage::

    python bench/dense_step_probe.py [--shape 8,300,60,320,1024]
        [--lattice standard|multiblank] [--steps 4] [--gap 0]
"""

import argparse
import os
import resource
import statistics
import time

import torch

from espnet_multiblank import multiblank_rnnt_loss

REPORTED = "/sys/module/page_reporting/parameters/reported_kib"


def _reported_mib() -> float:
    try:
        with open(REPORTED) as f:
            return int(f.read()) / 1024
    except OSError:
        return float("nan")


def _times():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8,300,60,320,1024", help="B,T,U,J,V")
    ap.add_argument("--lattice", default="standard", choices=("standard", "multiblank"))
    ap.add_argument("--steps", type=int, default=4, help="timed steps (after 1)")
    ap.add_argument("--gap", type=float, default=0.0, help="s of sleep, every other")
    args = ap.parse_args()
    torch.set_num_threads(1)
    B, T, U, J, V = (int(v) for v in args.shape.split(","))
    gen = torch.Generator().manual_seed(0)
    enc = torch.randn(B, T, J, generator=gen)
    pred = torch.randn(B, U + 1, J, generator=gen)
    weight = torch.randn(V, J, generator=gen) / J**0.5
    bias = torch.randn(V, generator=gen) * 0.1
    if args.lattice == "multiblank":
        blank, big = V - 1, (2, 4, 8)
        labels = torch.randint(0, V - 4, (B, U), generator=gen)
    else:
        blank, big = 0, ()
        labels = torch.randint(1, V, (B, U), generator=gen)
    leaves = [x.requires_grad_(True) for x in (enc, pred, weight, bias)]
    act_lens, label_lens = torch.full((B,), T), torch.full((B,), U)

    def step(marks):
        for x in leaves:
            x.grad = None
        marks.append(_times())
        z = torch.nn.functional.linear(
            torch.tanh(enc[:, :, None] + pred[:, None]), *leaves[2:]
        )
        marks.append(_times())
        zl = z.detach().requires_grad_(True)
        loss = multiblank_rnnt_loss(zl, labels, act_lens, label_lens, blank, big)
        marks.append(_times())
        loss.backward()
        marks.append(_times())
        z.backward(zl.grad)
        marks.append(_times())

    step([])
    names = ("joint fwd", "loss fwd", "loss bwd", "joint bwd")
    rows = {}
    for r in range(2 * args.steps if args.gap else args.steps):
        gap = args.gap if r % 2 else 0.0
        before = _reported_mib()
        time.sleep(gap)
        reported = _reported_mib() - before
        marks = []
        step(marks)
        row = rows.setdefault(gap, {"reported": [], **{n: [] for n in names}})
        row["reported"].append(reported)
        for n, (a, b) in zip(names, zip(marks, marks[1:])):
            row[n].append((b[0] - a[0], b[1] - a[1]))
    print(
        f"{args.lattice} (B,T,U,J,V) = {(B, T, U, J, V)}, 1 thread, medians of "
        f"{args.steps} steps; CPU s (of which system); load {os.getloadavg()[0]:.2f}"
    )
    for gap, row in rows.items():
        cells = []
        total = [0.0, 0.0]
        for n in names:
            cpu = statistics.median(x[0] for x in row[n])
            sys_ = statistics.median(x[1] for x in row[n])
            total = [total[0] + cpu, total[1] + sys_]
            cells.append(f"{n} {cpu:.3f} ({sys_:.3f})")
        rep = statistics.median(row["reported"])
        print(
            f"  gap {gap:g} s: " + ", ".join(cells) + f"; step {total[0]:.3f} "
            f"({total[1]:.3f}); reported to the host during the gap {rep:.0f} MiB"
        )


if __name__ == "__main__":
    main()
