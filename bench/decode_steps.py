#!/usr/bin/env python3
"""Costs behind three decoding design choices, measured side by side in one run.

1. The prediction-network step of the searches on one row: ``CellStep`` (the
   first layer's input projection looked up per label, the recurrent weights
   transposed; ``JointStepper``'s eval path on a CPU), ``torch.lstm_cell`` (its
   fused path, and the CPU path before ``CellStep``) and a ``torch.nn.LSTM`` call;
   hot (called in a loop) and cold (after 32 MB of other memory traffic, as in a
   stream, where the encoder runs between two labels).
2. Intra-op threads during a search step (why ``single_thread_on_cpu`` runs the
   search with one thread): the same one-row step with 1 and 2 threads.
3. ``blank_decision`` of the multi-blank greedy search: ``total`` against ``symbol``.

The networks have the digits recipe's decoder sizes (LSTM 256, joint space 320,
V = 17 with big blanks [2, 4, 8]) and random weights; the encoder output is random.
Absolute times move between runs on a shared machine: compare the ratios.

Usage::

    .venv/bin/python bench/decode_steps.py [--repeats 2000] [--utterances 100]
"""

import argparse
import time

import torch

from espnet_multiblank.decoding import GreedySearch, JointStepper, single_thread_on_cpu
from espnet_multiblank.lattice import MultiblankLattice

H, J, V, D_ENC, BLANK, DURATIONS = 256, 320, 17, 144, 3, (2, 4, 8)


class Decoder(torch.nn.Module):
    """An RNN prediction network with ESPnet's TransducerDecoder attribute names."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.decoder = torch.nn.ModuleList([torch.nn.LSTM(H, H, 1, batch_first=True)])
        self.odim = V

    def init_state(self, batch):
        z = torch.zeros(1, batch, H)
        return z, z.clone()

    def rnn_forward(self, emb, state):
        out, (h, c) = self.decoder[0](emb, state)
        return out, (h, c)


class Joint(torch.nn.Module):
    """``lin_out(tanh(lin_enc(e) + lin_dec(d)))`` with ESPnet's JointNetwork names."""

    def __init__(self):
        super().__init__()
        self.lin_enc = torch.nn.Linear(D_ENC, J)
        self.lin_dec = torch.nn.Linear(H, J)
        self.lin_out = torch.nn.Linear(J, V)

    def forward(self, enc, dec, no_projection=False):
        if not no_projection:
            enc, dec = self.lin_enc(enc), self.lin_dec(dec)
        return self.lin_out(torch.tanh(enc + dec))


def per_call(fn, repeats):
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def per_cold_call(fn, repeats, flush):
    """Seconds per call of ``fn`` right after ``flush`` (other memory traffic)."""
    fn()
    spent = 0.0
    for _ in range(repeats):
        flush.add_(1.0)
        start = time.perf_counter()
        fn()
        spent += time.perf_counter() - start
    return spent / repeats


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--utterances", type=int, default=100)
    a = p.parse_args()
    torch.manual_seed(0)
    decoder, joint = Decoder().eval(), Joint().eval()
    with torch.no_grad():
        joint.lin_out.bias[BLANK - len(DURATIONS) : BLANK + 1] += 1.0
    stepper = JointStepper(decoder, joint)
    label = torch.tensor([5])
    state = decoder.init_state(1)
    emb = decoder.embed(label.view(1, 1))

    steps = {
        "CellStep": lambda: stepper.cell_step(label, state),
        "lstm_cell": lambda: stepper.cell_step.fused(label, state),
        "nn.LSTM": lambda: decoder.rnn_forward(emb, state),
    }
    flush = torch.zeros(8 << 20)  # 32 MB
    rows = []
    with torch.no_grad():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, fn in steps.items():  # hot, then cold, interleaved by kind
                hot = per_call(fn, a.repeats)
                cold = per_cold_call(fn, max(1, a.repeats // 4), flush)
                rows.append((threads, name, hot, cold))
        torch.set_num_threads(1)
        print("one-row prediction-network step (us per call), its LSTM layer only")
        print("threads  step        hot     cold   cold / CellStep's cold")
        base = {t: c for t, n, _, c in rows if n == "CellStep"}
        for threads, name, hot, cold in rows:
            print(
                f"{threads:7d}  {name:9s} {hot * 1e6:7.1f}  {cold * 1e6:7.1f}  "
                f"{cold / base[threads]:5.2f}"
            )
        one = {n: h for t, n, h, _ in rows if t == 1}
        two = {n: h for t, n, h, _ in rows if t == 2}
        ratio = two["CellStep"] / one["CellStep"]
        print(f"2 threads / 1 thread (CellStep, hot): {ratio:.2f}")

        g = torch.Generator().manual_seed(1)
        lens = torch.randint(40, 120, (a.utterances,), generator=g).tolist()
        encs = [torch.randn(T, D_ENC, generator=g) for T in lens]
        lattice = MultiblankLattice.create(BLANK, DURATIONS)
        searches = {
            d: GreedySearch(stepper, lattice, blank_decision=d)
            for d in ("symbol", "total")
        }
        spent = dict.fromkeys(searches, 0.0)
        with single_thread_on_cpu("cpu"):
            for _ in range(3):  # interleaved
                for d, search in searches.items():
                    start = time.perf_counter()
                    for enc in encs:
                        search.search_one(enc)
                    spent[d] += time.perf_counter() - start
        print(f"\nmulti-blank greedy search, {a.utterances} utterances x 3 (s)")
        for d, secs in spent.items():
            print(f"  blank_decision {d:6s}: {secs:.3f}")
        print(f"  total / symbol: {spent['total'] / spent['symbol']:.3f}")


if __name__ == "__main__":
    main()
