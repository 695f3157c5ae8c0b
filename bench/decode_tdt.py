#!/usr/bin/env python3
"""Greedy search time of the digits recipe's three models, side by side in one run.

The TDT goal of the recipe: TDT greedy search (search alone, same batch size) at
least as fast as multi-blank greedy search at the same largest duration. This loads
the trained models of a recipe run (``EXP/asr_{standard,multiblank,tdt}``), encodes
the first N utterances of a test set once per model, then times the greedy searches
alone on those encoder outputs, interleaved over several rounds (one torch thread,
``torch.no_grad``), and counts the joint-network evaluations and prediction-network
steps of each search (a separate, untimed pass).

Usage::

    .venv/bin/python bench/decode_tdt.py --exp egs/digits/asr1/exp \\
        --wav_scp egs/digits/asr1/data/test/wav.scp [--num 200] [--rounds 5] \\
        [--batch_size 1]

Absolute times move between runs on a shared machine: compare the ratios.
"""

import argparse
import statistics
import time
from pathlib import Path

import soundfile
import torch

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.decoding import single_thread_on_cpu

#: (model dir, search type) of the greedy searches compared
SEARCHES = (
    ("standard", "mb_greedy"),
    ("multiblank", "mb_greedy"),
    ("tdt", "tdt_greedy"),
)


def load(exp: Path, name: str):
    from espnet2.tasks.asr import ASRTask

    d = exp / f"asr_{name}"
    model, _ = ASRTask.build_model_from_file(
        d / "config.yaml", d / "valid.loss.ave.pth", "cpu"
    )
    return model.eval()


def encode(model, wavs):
    """[(T, D_enc)] encoder outputs, one utterance at a time."""
    out = []
    with torch.no_grad():
        for wav in wavs:
            speech = torch.from_numpy(wav)[None]
            enc, lens = model.encode(speech, torch.tensor([speech.size(1)]))
            out.append(enc[0, : int(lens[0])])
    return out


def run(search, encs, batch_size):
    """Hypotheses of every utterance (batched in input order when batch_size > 1)."""
    if batch_size == 1:
        return [search.search_one(e) for e in encs]
    hyps = []
    for i in range(0, len(encs), batch_size):
        chunk = encs[i : i + batch_size]
        lens = torch.tensor([e.size(0) for e in chunk])
        padded = torch.nn.utils.rnn.pad_sequence(chunk, batch_first=True)
        hyps += search.search_batch(padded, lens)
    return hyps


def counts(search, encs, batch_size):
    """(joint-network calls, rows evaluated, prediction-network calls, rows)."""
    stepper = search.stepper
    calls = {"joint": [0, 0], "step": [0, 0]}
    joint, step = stepper.joint, stepper.step

    def counted_joint(e, d):
        calls["joint"][0] += 1
        calls["joint"][1] += e.size(0)
        return joint(e, d)

    def counted_step(labels, state):
        calls["step"][0] += 1
        calls["step"][1] += labels.numel()
        return step(labels, state)

    stepper.joint, stepper.step = counted_joint, counted_step
    try:
        run(search, encs, batch_size)
    finally:
        del stepper.joint, stepper.step
    return calls["joint"] + calls["step"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exp", type=Path, required=True)
    p.add_argument("--wav_scp", type=Path, required=True)
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=1)
    a = p.parse_args()

    espnet_multiblank.register()
    from espnet_multiblank.espnet.inference.search import build_transducer_search

    torch.set_num_threads(1)
    lines = a.wav_scp.read_text().splitlines()[: a.num]
    wavs = [soundfile.read(line.split()[1], dtype="float32")[0] for line in lines]
    cases = {}
    for name, search_type in SEARCHES:
        if not (a.exp / f"asr_{name}").is_dir():
            print(f"skipped {name}: no {a.exp / f'asr_{name}'}")
            continue
        model = load(a.exp, name)
        search = build_transducer_search(model, search_type=search_type)
        cases[name, search_type] = (search, encode(model, wavs))

    times = {k: [] for k in cases}
    with torch.no_grad(), single_thread_on_cpu(torch.device("cpu")):
        for k, (search, encs) in cases.items():  # warm-up
            run(search, encs[:10], a.batch_size)
        for r in range(a.rounds):
            keys = list(cases)
            keys = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate the order
            for k in keys:
                search, encs = cases[k]
                t0 = time.perf_counter()
                run(search, encs, a.batch_size)
                times[k].append(time.perf_counter() - t0)

    frames = {k: sum(e.size(0) for e in cases[k][1]) for k in cases}
    print(
        f"{len(wavs)} utterances, batch {a.batch_size}, {a.rounds} rounds, "
        "median search seconds (one thread)"
    )
    print(
        f"{'model':<11} {'search':<11} {'seconds':>8} {'frames':>7} {'joint calls':>11}"
        f" {'joint rows':>10} {'pred calls':>10} {'us/joint call':>13}"
    )
    med = {}
    for k, (search, encs) in cases.items():
        med[k] = statistics.median(times[k])
        jc, jr, pc, pr = counts(search, encs, a.batch_size)
        print(
            f"{k[0]:<11} {k[1]:<11} {med[k]:8.3f} {frames[k]:7d} {jc:11d} {jr:10d}"
            f" {pc:10d} {1e6 * med[k] / max(jc, 1):13.1f}"
        )
    mb, tdt = ("multiblank", "mb_greedy"), ("tdt", "tdt_greedy")
    if mb in med and tdt in med:
        ratio = med[mb] / med[tdt]
        print(f"tdt_greedy vs mb_greedy (search time ratio mb / tdt): {ratio:.2f}x")
    std = ("standard", "mb_greedy")
    if std in med and tdt in med:
        print(f"tdt_greedy vs standard (mb_greedy code): {med[std] / med[tdt]:.2f}x")


if __name__ == "__main__":
    main()
