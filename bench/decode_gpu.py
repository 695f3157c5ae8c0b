#!/usr/bin/env python3
"""Label-looping against frame-looping greedy search: search time and RTF, any device.

For each lattice (standard RNN-T, multi-blank [2, 4, 8], TDT durations 0..8) and batch
size (default 1, 16, 128), the same encoder outputs are decoded, in interleaved
timed rounds, by

* ``frame``: the greedy search's batch loops in the frame-looping order
  (``LabelLoopingGreedySearch`` with ``window = 1, max_inner = 1``: one joint call
  per step for every utterance, then the prediction network for the rows that
  emitted a label);
* ``frame-one`` (batch 1 only): the one-utterance loop (``GreedySearch.search_one``,
  what ``--batch_size 1`` decoding runs);
* ``label``: the label-looping search (``LabelLoopingGreedySearch``) with its
  default window and inner-loop limit; ``label-w1`` (when that default window is
  not 1) with ``window = 1``, the paper's loop, which is also what
  ``GreedySearch.search_batch`` (``mb_greedy`` batched) runs.

Columns: median search seconds over the rounds, ms per utterance, RTF of the search
(search seconds / audio seconds, audio = encoder frames x the frame shift, 40 ms in
the recipe), speed-up over ``frame`` at the same batch size, and whether the
hypotheses (labels) equal ``frame``'s. Utterances are sorted by length and cut into
batches, as the plug-in's inference does. On a GPU every timing is bracketed by
``torch.cuda.synchronize()``.

Models:

* default: random networks of the digits recipe's decoder sizes (LSTM 160, joint
  space 160, encoder output 96, 14 tokens; multi-blank: + 3 big blanks; TDT: + 9
  duration outputs), built on the CPU from a fixed seed (the same weights on every
  machine), with blank biases that make them emit about as the recipe's trained
  models do (about 3-4 labels per 50 frames; the multi-blank and TDT models skip
  80-85% of the frames; see the ``labels/utt`` and ``skip%`` columns). Encoder
  outputs are random, lengths drawn from 20..100 frames.
* ``--exp DIR --data wav.scp``: a trained model (``DIR/config.yaml`` and
  ``DIR/valid.loss.ave.pth``, or ``--model-file``) and real speech; needs ESPnet.
  The encoder runs once per utterance (not timed with the search; its time per
  utterance is printed), then the searches decode its outputs; the RTF column is
  then the search's, and ``enc+search RTF`` adds the encoder.

Usage::

    python bench/decode_gpu.py                         # cuda if available, else cpu
    python bench/decode_gpu.py --device cpu --batch-sizes 1,32 --utts 256
    python bench/decode_gpu.py --device cpu --batch-sizes 32 \\
        --exp runs/exp/asr_multiblank --data runs/data/test/wav.scp

``bench/gpu_check.sh`` runs it with no arguments; ``DECODE_BUDGET_S`` (seconds) then
bounds it (configurations that would not fit are skipped and listed) and results go
to ``$OUT/decode.jsonl``.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from espnet_multiblank.decoding import (  # noqa: E402
    GreedySearch,
    JointStepper,
    LabelLoopingGreedySearch,
    single_thread_on_cpu,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice  # noqa: E402

# the digits recipe's sizes (egs/digits/asr1/conf/train_*.yaml)
H, J, D_ENC, TOKENS = 160, 160, 96, 14
BIG_BLANKS = (2, 4, 8)
TDT_DURATIONS = tuple(range(9))
FRAME_SHIFT = 0.04  # seconds per encoder frame (10 ms hop, 4x subsampling)


class Decoder(torch.nn.Module):
    """One-layer LSTM prediction network with ESPnet's TransducerDecoder names."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, H)
        self.decoder = torch.nn.ModuleList([torch.nn.LSTM(H, H, 1, batch_first=True)])
        self.odim = vocab

    def init_state(self, batch: int):
        z = torch.zeros(1, batch, H, device=self.embed.weight.device)
        return z, z.clone()

    def rnn_forward(self, emb, state):
        out, (h, c) = self.decoder[0](emb, state)
        return out, (h, c)


class Joint(torch.nn.Module):
    """``lin_out(tanh(lin_enc(e) + lin_dec(d)))`` with ESPnet's JointNetwork names."""

    def __init__(self, out: int):
        super().__init__()
        self.lin_enc = torch.nn.Linear(D_ENC, J)
        self.lin_dec = torch.nn.Linear(H, J)
        self.lin_out = torch.nn.Linear(J, out)

    def forward(self, enc, dec, no_projection=False):
        if not no_projection:
            enc, dec = self.lin_enc(enc), self.lin_dec(dec)
        return self.lin_out(torch.tanh(enc + dec))


def random_model(kind: str, seed: int = 0):
    """(decoder, joint, lattice) of the recipe's sizes, random weights from ``seed``,
    blank biases chosen so that greedy search emits about one label per 12 frames
    (and, for the multi-blank model, mostly ``<blank8>``)."""
    torch.manual_seed(seed)
    if kind == "standard":
        vocab, blank, lattice = TOKENS, 0, MultiblankLattice.create(0)
        extra = 0
    elif kind == "multiblank":
        vocab = TOKENS + len(BIG_BLANKS)
        blank = len(BIG_BLANKS)  # <blank8> <blank4> <blank2> <blank> tokens...
        lattice = MultiblankLattice.create(blank, BIG_BLANKS)
        extra = 0
    elif kind == "tdt":
        vocab, blank = TOKENS, 0
        lattice = TDTLattice.create(blank, TDT_DURATIONS)
        extra = len(TDT_DURATIONS)
    else:
        raise ValueError(f"kind must be standard, multiblank or tdt, got {kind!r}")
    decoder, joint = Decoder(vocab).eval(), Joint(vocab + extra).eval()
    with torch.no_grad():  # values found by trying (labels/utt, skip% columns)
        joint.lin_out.weight.mul_(2.0)  # logits that depend on the inputs
        bias = joint.lin_out.bias
        bias.zero_()
        if kind == "standard":
            bias[blank] = 2.3
        elif kind == "multiblank":
            # <blank>, <blank2>, <blank4>, <blank8> at blank, blank - 1, ...
            for i, b in enumerate((0.8, 0.8, 1.2, 2.8)):
                bias[blank - i] = b
        else:
            bias[blank] = 0.8
            bias[vocab:] = torch.tensor([0.0, 0.5, 0.5, 1.0, 1.5, 1.5, 1.5, 1.5, 2.5])
    return decoder, joint, lattice


def searches(kind, stepper, lattice, batch):
    """[(name, search, method)] of the contenders at this batch size."""
    frame = LabelLoopingGreedySearch(stepper, lattice, window=1, max_inner=1)
    label = LabelLoopingGreedySearch(stepper, lattice)
    out = [("frame", frame, "batch")]
    if batch == 1:
        out.append(("frame-one", GreedySearch(stepper, lattice), "one"))
    out.append(("label", label, "batch"))
    if label.window != 1:
        out.append(
            ("label-w1", LabelLoopingGreedySearch(stepper, lattice, window=1), "batch")
        )
    return out


def make_batches(encs, batch, device):
    order = sorted(range(len(encs)), key=lambda i: encs[i].size(0))
    batches = []
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        enc = torch.nn.utils.rnn.pad_sequence([encs[i] for i in idx], batch_first=True)
        lens = torch.tensor([encs[i].size(0) for i in idx])
        batches.append((idx, enc.to(device), lens.to(device)))
    return batches


def run_once(search, method, batches, n):
    """(seconds, hypotheses in input order)."""
    device = batches[0][1].device
    hyps = [None] * n
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with single_thread_on_cpu(device):
        for idx, enc, lens in batches:
            if method == "one":
                out = [search.search_one(enc[0, : lens[0]])]
            else:
                out = search.search_batch(enc, lens)
            for i, h in zip(idx, out):
                hyps[i] = h
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, hyps


class Model:
    """One model's networks, lattice and encoder outputs."""

    def __init__(self, kind, decoder, joint, lattice, encs, device, encoder_s=None):
        decoder.to(device)
        joint.to(device)
        vocab = decoder.odim + (lattice.num_durations if kind == "tdt" else 0)
        self.kind, self.lattice, self.encs = kind, lattice, encs
        self.stepper = JointStepper(decoder, joint, vocab)
        self.encoder_s = encoder_s


def bench_config(model, batch, args, device, deadline, configs_left, out):
    """Time every contender on ``model`` at batch size ``batch``; ``out(row)`` for
    each."""
    # small batches decode fewer utterances (one at a time is the slow case)
    encs = model.encs
    if args.min_utts > 0:
        encs = encs[: max(args.min_utts, 2 * batch)]
    frames = sum(e.size(0) for e in encs)
    audio = frames * args.frame_shift
    batches = make_batches(encs, batch, device)
    contenders = searches(model.kind, model.stepper, model.lattice, batch)
    start = time.perf_counter()  # warm-up, and the time one round takes
    for _, search, method in contenders:
        run_once(search, method, batches[:1], len(encs))
    per_round = (time.perf_counter() - start) * len(batches)
    rounds = args.rounds
    if deadline is not None:
        left = deadline - time.perf_counter()
        share = left / configs_left
        rounds = max(1, min(rounds, int(share / max(per_round, 1e-9))))
        if per_round > left:
            print(
                f"SKIPPED {model.kind} batch {batch}: about {per_round:.1f} s per "
                f"round, {left:.1f} s left",
                flush=True,
            )
            return
    times = {name: [] for name, _, _ in contenders}
    hyps = {}
    for _ in range(rounds):
        for name, search, method in contenders:
            seconds, hyps[name] = run_once(search, method, batches, len(encs))
            times[name].append(seconds)
    ref = statistics.median(times["frame"])
    ref_labels = [h.yseq for h in hyps["frame"]]
    labels = sum(len(h.yseq) - 1 for h in hyps["frame"]) / len(encs)
    skipped = sum(h.frames_skipped for h in hyps["frame"]) / frames
    for name, search, _ in contenders:
        seconds = statistics.median(times[name])
        row = {
            "kind": model.kind,
            "model": args.model_name,
            "device": str(device),
            "batch": batch,
            "search": name,
            "class": type(search).__name__,
            "window": getattr(search, "window", None),
            "max_inner": (
                search.inner_limit(device) if hasattr(search, "inner_limit") else None
            ),
            "utts": len(encs),
            "frames": frames,
            "audio_s": round(audio, 3),
            "rounds": rounds,
            "search_s": seconds,
            "ms_per_utt": 1000 * seconds / len(encs),
            "rtf": seconds / audio,
            "speedup_vs_frame": ref / seconds,
            "same_labels_as_frame": [h.yseq for h in hyps[name]] == ref_labels,
            "labels_per_utt": labels,
            "frames_skipped_pct": 100 * skipped,
        }
        if model.encoder_s is not None:
            enc_s = model.encoder_s * len(encs) / len(model.encs)
            row["enc_plus_search_rtf"] = (enc_s + seconds) / audio
        if row["max_inner"] == float("inf"):
            row["max_inner"] = None  # JSON: no limit
        out(row)
        print(
            f"{model.kind:10s} {args.model_name:7s} b{batch:<4d} {name:9s} "
            f"W={str(row['window']):4s} K={str(row['max_inner']):4s} "
            f"{seconds:8.4f} s {row['ms_per_utt']:8.3f} ms/utt  "
            f"RTF {row['rtf']:.5f}  x{row['speedup_vs_frame']:.2f}  "
            f"same={row['same_labels_as_frame']}  labels/utt {labels:.1f}  "
            f"skip% {100 * skipped:.0f}  ({len(encs)} utts, {rounds} rounds)"
            + (
                f"  enc+search RTF {row['enc_plus_search_rtf']:.5f}"
                if "enc_plus_search_rtf" in row
                else ""
            ),
            flush=True,
        )


def random_encs(n, seed, device_hint="cpu"):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(20, 101, (n,), generator=g).tolist()
    return [torch.randn(T, D_ENC, generator=g) for T in lens]


def trained_model(args, device):
    """(kind, decoder, joint, lattice, encoder outputs, encoder seconds)."""
    import soundfile

    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

    # isort: split
    from espnet2.tasks.asr import ASRTask

    import espnet_multiblank
    from espnet_multiblank.espnet.inference.search import (
        fix_decoder_blank,
        joint_size_of,
        lattice_from_model,
    )

    espnet_multiblank.register()
    exp = Path(args.exp)
    model_file = args.model_file or exp / "valid.loss.ave.pth"
    model, _ = ASRTask.build_model_from_file(
        exp / "config.yaml", model_file, str(device)
    )
    model.eval()
    lattice = lattice_from_model(model)
    fix_decoder_blank(model.decoder, lattice)
    if isinstance(lattice, TDTLattice):
        kind = "tdt"
    else:
        kind = "multiblank" if lattice.is_multiblank else "standard"
    lines = Path(args.data).read_text().splitlines()[: args.utts]
    encs, enc_seconds = [], 0.0
    with torch.no_grad():
        for line in lines:
            wav = torch.tensor(soundfile.read(line.split()[1])[0], dtype=torch.float32)
            x = wav.unsqueeze(0).to(device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            enc, _ = model.encode(x, torch.tensor([x.size(1)], device=device))
            if device.type == "cuda":
                torch.cuda.synchronize()
            enc_seconds += time.perf_counter() - start
            encs.append(enc[0].cpu())
    assert joint_size_of(model, lattice) > 0
    return kind, model.decoder, model.joint_network, lattice, encs, enc_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device", default=None, help="cuda / cpu (default: cuda if " "available)"
    )
    parser.add_argument("--batch-sizes", default="128,16,1")
    parser.add_argument(
        "--kinds",
        default="standard,multiblank,tdt",
        help="random models to run (ignored with --exp)",
    )
    parser.add_argument(
        "--utts",
        type=int,
        default=256,
        help="utterances (random models; with --exp the first N of --data)",
    )
    parser.add_argument(
        "--min-utts",
        type=int,
        default=32,
        help="utterances decoded at batch size B: the first max(min_utts, 2 B) "
        "(0: all)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (the searches use 1 on CPU)",
    )
    parser.add_argument("--frame-shift", type=float, default=FRAME_SHIFT)
    parser.add_argument("--exp", default=None, help="trained model directory")
    parser.add_argument("--model-file", default=None)
    parser.add_argument("--data", default=None, help="wav.scp (with --exp)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float(os.environ.get("DECODE_BUDGET_S", 0)) or None,
        help="stop starting configurations after this many seconds "
        "(default: $DECODE_BUDGET_S, else none)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSONL output (default: " "$OUT/decode.jsonl when OUT is set)",
    )
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    device = torch.device(
        args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    torch.set_num_threads(args.threads)
    out_path = args.out or (
        str(Path(os.environ["OUT"]) / "decode.jsonl") if os.environ.get("OUT") else None
    )
    start = time.perf_counter()
    # leave a few seconds for writing the results
    deadline = start + args.budget_s - 5 if args.budget_s else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {device} ({name}), "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"budget {args.budget_s} s",
        flush=True,
    )
    rows = []

    def out(row):  # written at once: a run stopped by its budget keeps what it did
        rows.append(row)
        if out_path:
            with open(out_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    if args.exp:
        if not args.data:
            parser.error("--exp needs --data (a wav.scp)")
        kind, decoder, joint, lattice, encs, enc_s = trained_model(args, device)
        args.model_name = "trained"
        print(
            f"{kind} model {args.exp}: {len(encs)} utterances, encoder "
            f"{1000 * enc_s / len(encs):.2f} ms/utt",
            flush=True,
        )
        models = [Model(kind, decoder, joint, lattice, encs, device, enc_s)]
    else:
        args.model_name = "random"
        encs = random_encs(args.utts, args.seed)
        models = [
            Model(kind, *random_model(kind, args.seed), encs, device)
            for kind in args.kinds.split(",")
        ]
    # warm-up of the device and the libraries (not counted in any configuration)
    for model in models:
        warm = make_batches(model.encs[:2], 2, device)
        for _, search, method in searches(model.kind, model.stepper, model.lattice, 2):
            run_once(search, method, warm, 2)
    configs = [(model, b) for b in args.batch_sizes for model in models]
    for i, (model, batch) in enumerate(configs):
        bench_config(model, batch, args, device, deadline, len(configs) - i, out)
    if out_path:
        print(f"{len(rows)} rows -> {out_path}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    bad = [r for r in rows if not r["same_labels_as_frame"]]
    if bad:
        print(f"ERROR: {len(bad)} contenders disagree with frame-looping")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
