#!/usr/bin/env python3
"""Costs behind three decoding design choices, measured side by side in one run.

1. The prediction-network step of the searches: ``torch.lstm_cell`` per layer
   (``JointStepper``'s eval path) against a ``torch.nn.LSTM`` call on one row.
2. Intra-op threads during a search step (why ``single_thread_on_cpu`` runs the
   search with one thread): the same one-row step with 1 and 2 threads.
3. ``blank_decision`` of the multi-blank greedy search: ``total`` against ``symbol``.

The networks have the digits recipe's decoder sizes (LSTM 160, joint space 160,
V = 17 with big blanks [2, 4, 8]) and random weights; the encoder output is random.
Absolute times move between runs on a shared machine: compare the ratios.

Usage::

    .venv/bin/python bench/decode_steps.py [--repeats 2000] [--utterances 100]
"""

import argparse
import time

import torch

from espnet_multiblank.decoding import (
    JointStepper,
    MultiblankGreedySearch,
    single_thread_on_cpu,
)
from espnet_multiblank.lattice import MultiblankLattice

H, J, V, D_ENC, BLANK, DURATIONS = 160, 160, 17, 96, 3, (2, 4, 8)


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

    rows = []
    with torch.no_grad():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cell = per_call(lambda: stepper.step(label, state), a.repeats)
            lstm = per_call(lambda: decoder.rnn_forward(emb, state), a.repeats)
            rows.append((threads, cell, lstm))
        torch.set_num_threads(1)
        print("one-row prediction-network step (us per call)")
        print("threads  lstm_cell  nn.LSTM  ratio")
        for threads, cell, lstm in rows:
            us = (cell * 1e6, lstm * 1e6)
            print(f"{threads:7d}  {us[0]:9.1f}  {us[1]:7.1f}  {lstm / cell:5.2f}")
        print(f"2 threads / 1 thread (lstm_cell): {rows[1][1] / rows[0][1]:.2f}")

        g = torch.Generator().manual_seed(1)
        lens = torch.randint(40, 120, (a.utterances,), generator=g).tolist()
        encs = [torch.randn(T, D_ENC, generator=g) for T in lens]
        lattice = MultiblankLattice.create(BLANK, DURATIONS)
        searches = {
            d: MultiblankGreedySearch(stepper, lattice, blank_decision=d)
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
