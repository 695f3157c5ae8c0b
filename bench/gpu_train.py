"""ESPnet training steps of the digits recipe's multi-blank and TDT models, dense and
with the fused joint + loss, on a GPU (issue 40; the ``train`` stage of
``bench/gpu_check.sh``), or on the CPU to try it.

Each run builds the recipe's model from its training config
(``egs/digits/asr1/conf/train_multiblank.yaml``, ``train_tdt.yaml``: ``model:
multiblank_espnet``, the chunk conformer, the LSTM transducer decoder, the joint
network, CTC weight 0.3, SpecAugment, global MVN) through ESPnet's ASR task
(``MultiblankASRTask.build_model``, ESPnet's parser and defaults), with
``model_conf.transducer_fused_joint`` false ("dense") or true ("fused"), and trains it
for ``--steps`` steps as ESPnet's trainer does one: the model's forward (loss, stats,
weight), backward, the gradient norm clipped at the config's ``grad_clip`` (a
non-finite norm skips the update, as ESPnet does), the config's optimiser (Adam, lr
0.003) and its per-batch scheduler (warmup 300 steps), from ESPnet's
``set_all_random_seed(seed)``, so the dense and the fused run of a lattice start from
the same weights and see the same batches.

The batches come from a data file that needs no recipe run where the steps run (the
GPU machine has no TTS and no data): ``--prepare RECIPE_DIR`` writes it HERE from a
recipe run's training set (``data/train``: ``--utts`` utterances, every k-th key, as
16-bit 8 kHz samples with their word ids; the token list; the collect_stats feature
statistics the config's global MVN uses): 256 utterances (~2 s each) are ~7 MB. The
steps draw batches of the config's size (8) as ESPnet's folded batches are: sorted by
length, then the batches shuffled (each pass over the file anew). Without a data file
``--synthetic`` makes utterances of 1-7 "words", each word a fixed pair of tones (its
own frequencies and length) in noise, labelled with the recipe's word tokens: learnable,
deterministic, no carried data; the feature statistics then come from ESPnet's
frontend over them. The recipe's own utterances are the default because "the loss falls
as on the CPU" compares with the recipe's training (exp/*/train.log).

Per run, one JSON line (``--out``, and stdout): the losses at the start and the end
(means of the first and the last ``--window`` steps), a short curve, the CTC and
transducer parts at the end, how many steps had a non-finite loss or gradient norm
(skipped updates), whether all parameters are finite at the end, the median / p90 step
time after the first ``--warmup`` steps (the first step, with the kernels' compilation,
apart), the peak memory (``torch.cuda.max_memory_allocated``; on the CPU none), and, per
lattice, a last line comparing dense and fused: the largest relative difference of
their losses over the first ``--window`` steps (same weights, same batches: they should
agree to float rounding until the trajectories drift apart), the ratios of their step
times and peak memories. "The loss falls as on the CPU": the data file also holds the
recipe's own CPU training curve (``exp/asr_<lattice>/train.log``: ESPnet's mean loss per
50 batches, same model, config, batch size, optimiser and schedule, on all 8000
training utterances), and each row puts it beside its own (``cpu_curve``,
``cpu_window_loss`` against ``window_loss``: the same steps). This run repeats 256 of
those utterances (300 steps of 8 are ~9 passes), so its loss may fall further.

Usage:
    python bench/gpu_train.py --prepare /path/to/egs/digits/asr1 \\
        --data bench/out/train_data/digits.npz              # here, once
    python bench/gpu_train.py --device cpu --steps 5       # a try on the CPU
    python bench/gpu_train.py --device cuda --steps 300 --budget-s 140 \\
        --out $OUT/train.jsonl                               # on the GPU
    python bench/gpu_train.py --check-imports   # the training path's imports
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import wave

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF_DIR = os.path.join(ROOT, "egs", "digits", "asr1", "conf")
DEFAULT_DATA = os.path.join(ROOT, "bench", "out", "train_data", "digits.npz")
#: the runs' lattices (conf/train_<lattice>.yaml; "standard" works too)
LATTICES = ("multiblank", "tdt")
JOINTS = ("dense", "fused")
#: the recipe's word token list (local/make_token_list.py), for --synthetic
SYNTHETIC_TOKENS = ["<blank>", "<unk>", "eight", "five", "four", "nine", "oh", "one"]
SYNTHETIC_TOKENS += ["seven", "six", "three", "two", "zero", "<sos/eos>"]


# ------------------------------------------------------------------ the data file
def prepare(recipe_dir: str, path: str, utts: int) -> dict:
    """Write the data file from a recipe run's training set (see the module's doc).

    Returns what was written: audio (N_samples,) int16 and audio_offsets (N + 1,)
    int64, text (N_tokens,) int32 word ids and text_offsets (N + 1,) int64, keys (N,)
    str, tokens (V,) str (the recipe's token list), the feature statistics count ()
    float, sum (23,) float64, sum_square (23,) float64, and fs.
    """
    data = os.path.join(recipe_dir, "data")
    with open(os.path.join(data, "token_list", "word", "tokens.txt")) as f:
        tokens = [line.rstrip("\n") for line in f if line.strip()]
    ids = {t: i for i, t in enumerate(tokens)}
    with open(os.path.join(data, "train", "wav.scp")) as f:
        wavs = dict(line.split(maxsplit=1) for line in f if line.strip())
    with open(os.path.join(data, "train", "text")) as f:
        texts = dict((line.split(maxsplit=1) + [""])[:2] for line in f if line.strip())
    keys = sorted(k for k in wavs if k in texts)
    step = max(1, len(keys) // utts)  # spread over the voices (keys sort by voice)
    keys = keys[::step][:utts]
    audio, text, a_off, t_off, fs = [], [], [0], [0], None
    for k in keys:
        with wave.open(wavs[k].strip()) as w:
            assert w.getsampwidth() == 2 and w.getnchannels() == 1, k
            fs = fs or w.getframerate()
            assert w.getframerate() == fs, k
            a = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        t = np.array([ids.get(word, ids["<unk>"]) for word in texts[k].split()])
        audio.append(a)
        text.append(t.astype(np.int32))
        a_off.append(a_off[-1] + len(a))
        t_off.append(t_off[-1] + len(t))
    stats = np.load(
        os.path.join(recipe_dir, "exp", "asr_stats_word", "train", "feats_stats.npz")
    )
    curves = {}
    for lattice in ("standard",) + LATTICES:
        log = os.path.join(recipe_dir, "exp", f"asr_{lattice}", "train.log")
        if os.path.exists(log):
            with open(os.path.join(CONF_DIR, f"train_{lattice}.yaml")) as f:
                per_epoch = _conf_int(f.read(), "num_iters_per_epoch")
            with open(log) as f:
                curves[f"cpu_curve_{lattice}"] = recipe_curve(f.read(), per_epoch)
    out = dict(
        audio=np.concatenate(audio),
        audio_offsets=np.array(a_off, dtype=np.int64),
        text=np.concatenate(text),
        text_offsets=np.array(t_off, dtype=np.int64),
        keys=np.array(keys),
        tokens=np.array(tokens),
        count=stats["count"],
        sum=stats["sum"],
        sum_square=stats["sum_square"],
        fs=np.array(fs),
        **curves,
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(path, **out)
    return out


_LOG_WINDOW = re.compile(
    r"(\d+)epoch:train:(\d+)-(\d+)batch: .*?[ ,]loss=([0-9.eE+-]+|nan|inf)"
)


def recipe_curve(log: str, per_epoch: int, last_step: int = 2000) -> np.ndarray:
    """ESPnet's train.log to (K, 3) float64 rows (first step, last step, mean loss)
    of its per-``log_interval`` reports, steps counted over the epochs of
    ``per_epoch`` batches, up to ``last_step`` (a log that a resumed training
    appended to keeps its first report of each window)."""
    rows = {}
    for e, a, b, loss in _LOG_WINDOW.findall(log):
        first = (int(e) - 1) * per_epoch + int(a)
        last = (int(e) - 1) * per_epoch + int(b)
        if last <= last_step and first not in rows:
            rows[first] = (first, last, float(loss))
    return np.array([rows[k] for k in sorted(rows)], dtype=np.float64).reshape(-1, 3)


def _conf_int(text: str, key: str) -> int:
    m = re.search(rf"^{key}:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def load(path: str) -> dict:
    """The data file as lists: speech [(L_i,) float32 in [-1, 1)], text [(U_i,)
    int64], tokens, stats (count, sum, sum_square), source."""
    d = np.load(path, allow_pickle=False)
    a, ao, t, to = d["audio"], d["audio_offsets"], d["text"], d["text_offsets"]
    n = len(ao) - 1
    return dict(
        speech=[a[ao[i] : ao[i + 1]].astype(np.float32) / 32768 for i in range(n)],
        text=[t[to[i] : to[i + 1]].astype(np.int64) for i in range(n)],
        tokens=[str(x) for x in d["tokens"]],
        stats={k: d[k] for k in ("count", "sum", "sum_square")},
        source=os.path.basename(path),
        cpu_curves={
            k[len("cpu_curve_") :]: d[k] for k in d.files if k.startswith("cpu_curve_")
        },
    )


def synthetic(tokens: list, utts: int, seed: int, fs: int = 8000) -> dict:
    """``utts`` utterances of 1-7 words; word w (a token that is not a symbol) is
    two tones of its own frequencies, 150-300 ms long, between 50-150 ms pauses, in
    noise at -30 dB. speech [(L_i,) float32], text [(U_i,) int64]."""
    rng = np.random.default_rng(seed)
    words = [i for i, t in enumerate(tokens) if not t.startswith("<")]
    f1 = {w: 300 + 170 * j for j, w in enumerate(words)}
    f2 = {w: 2300 - 130 * j for j, w in enumerate(words)}
    dur = {
        w: 0.15 + 0.15 * ((j * 7) % len(words)) / len(words)
        for j, w in enumerate(words)
    }
    speech, text = [], []
    for _ in range(utts):
        seq = rng.choice(words, size=int(rng.integers(1, 8)))
        parts = [np.zeros(int(fs * rng.uniform(0.05, 0.15)))]
        for w in seq:
            n = int(fs * dur[w] * rng.uniform(0.9, 1.1))
            x = np.arange(n) / fs
            env = np.sin(np.pi * np.arange(n) / n)
            tone = np.sin(2 * np.pi * f1[w] * x) + 0.5 * np.sin(2 * np.pi * f2[w] * x)
            parts += [0.2 * env * tone, np.zeros(int(fs * rng.uniform(0.05, 0.15)))]
        s = np.concatenate(parts)
        s = s + 0.006 * rng.standard_normal(len(s))
        speech.append(s.astype(np.float32))
        text.append(np.array(seq, dtype=np.int64))
    return dict(
        speech=speech,
        text=text,
        tokens=list(tokens),
        stats=None,
        source="synthetic",
        cpu_curves={},
    )


def batches(data: dict, batch_size: int, seed: int, ids: np.ndarray):
    """Endless batches as ESPnet's folded ones: sorted by length, chunked, the chunks
    shuffled each pass. ``ids`` (V,) int64: the model's id of each of the data's
    tokens (the multi-blank model's token list has the big blanks in front). Yields
    (speech (B, L) float32, speech_lengths (B,) int64, text (B, U) int64 padded with
    -1, text_lengths (B,) int64), on the CPU."""
    import torch

    order = sorted(range(len(data["speech"])), key=lambda i: len(data["speech"][i]))
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    chunks = [c for c in chunks if len(c) == batch_size] or chunks
    rng = np.random.default_rng(seed)
    while True:
        for j in rng.permutation(len(chunks)):
            idx = chunks[j]
            sp = [data["speech"][i] for i in idx]
            tx = [data["text"][i] for i in idx]
            speech = torch.zeros(len(idx), max(map(len, sp)))
            text = torch.full((len(idx), max(map(len, tx))), -1, dtype=torch.long)
            for r, (s, t) in enumerate(zip(sp, tx)):
                speech[r, : len(s)] = torch.from_numpy(s)
                text[r, : len(t)] = torch.from_numpy(ids[t])
            yield (
                speech,
                torch.tensor([len(s) for s in sp]),
                text,
                torch.tensor([len(t) for t in tx]),
            )


# ------------------------------------------------------------------ model and steps
def check_imports() -> list:
    """The modules the training path imports that fail here: [(module, error)]."""
    import importlib

    failed = []
    for m in (
        "espnet_multiblank.espnet.training.task",
        "espnet2.tasks.abs_task",
        "espnet2.torch_utils.set_all_random_seed",
        "espnet2.schedulers.abs_scheduler",
        "espnet2.asr.frontend.default",
        "espnet2.layers.global_mvn",
        "librosa.filters",
    ):
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001  (report every kind of failure)
            failed.append((m, f"{type(e).__name__}: {e}"))
    return failed


def feature_stats(config: dict, data: dict) -> dict:
    """ESPnet's collect_stats for global MVN over ``data``'s utterances, with the
    config's frontend: count () , sum (F,), sum_square (F,) float64."""
    import torch
    from espnet2.asr.frontend.default import DefaultFrontend

    fe = DefaultFrontend(**config.get("frontend_conf", {}))
    count, s, s2 = 0, 0.0, 0.0
    with torch.no_grad():
        for x in data["speech"]:
            feats, _ = fe(torch.from_numpy(x)[None], torch.tensor([len(x)]))
            f = feats[0].double().numpy()
            count, s, s2 = count + len(f), s + f.sum(0), s2 + (f**2).sum(0)
    return dict(count=np.array(count), sum=s, sum_square=s2)


def build(lattice: str, fused: bool, data: dict, tmp: str, device: str):
    """The recipe's model of ``lattice`` built by ESPnet's ASR task, its optimiser,
    its scheduler and the parsed args (seeded as ESPnet seeds a training)."""
    import torch
    import yaml
    from espnet2.tasks.abs_task import scheduler_classes
    from espnet2.torch_utils.set_all_random_seed import set_all_random_seed

    from espnet_multiblank.espnet.training.task import MultiblankASRTask

    with open(os.path.join(CONF_DIR, f"train_{lattice}.yaml")) as f:
        config = yaml.safe_load(f)
    config["model_conf"]["transducer_fused_joint"] = fused
    stats = data["stats"] or feature_stats(config, data)
    data["stats"] = stats
    np.savez(os.path.join(tmp, "feats_stats.npz"), **stats)
    config["normalize_conf"] = {"stats_file": os.path.join(tmp, "feats_stats.npz")}
    cfg, tok = os.path.join(tmp, f"{lattice}.yaml"), os.path.join(tmp, "tokens.txt")
    with open(cfg, "w") as f:
        yaml.safe_dump(config, f)
    with open(tok, "w") as f:
        f.write("\n".join(data["tokens"]) + "\n")
    args = MultiblankASRTask.get_parser().parse_args(
        ["--config", cfg, "--token_list", tok, "--token_type", "word"]
    )
    set_all_random_seed(args.seed)
    model = MultiblankASRTask.build_model(args).to(torch.device(device))
    optimizers = MultiblankASRTask.build_optimizers(args, model)
    scheduler = scheduler_classes[args.scheduler](optimizers[0], **args.scheduler_conf)
    return model, optimizers[0], scheduler, args


def train(lattice, fused, data, args, tmp, budget_s):
    """One run: ``args.steps`` training steps (fewer when ``budget_s`` seconds, the
    model's build included, run out; at least one); its JSON row."""
    import torch
    from espnet2.schedulers.abs_scheduler import AbsBatchStepScheduler

    cuda = args.device.startswith("cuda")
    t0 = time.perf_counter()
    deadline = t0 + budget_s if budget_s else math.inf
    model, optim, scheduler, margs = build(lattice, fused, data, tmp, args.device)
    build_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        model_mb = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    model.train()
    ids = np.array([list(model.token_list).index(t) for t in data["tokens"]])
    feed = batches(data, args.batch_size or margs.batch_size, margs.seed, ids)
    losses, parts, times, bad_loss, bad_grad = [], {}, [], 0, 0
    t_run = time.perf_counter()
    for step in range(args.steps):
        if step and time.perf_counter() > deadline:
            break
        batch = next(feed)  # padded on the host, outside the step's time
        t = time.perf_counter()
        speech, speech_lengths, text, text_lengths = (
            x.to(args.device, non_blocking=True) for x in batch
        )
        loss, stats, _ = model(speech, speech_lengths, text, text_lengths)
        loss.backward()
        # ESPnet's trainer: clip, skip the update on a non-finite norm, step the
        # optimiser and the per-batch scheduler, zero the gradients
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), margs.grad_clip)
        if torch.isfinite(norm):
            optim.step()
            if isinstance(scheduler, AbsBatchStepScheduler):
                scheduler.step()
        else:
            bad_grad += 1
        optim.zero_grad()
        value = float(loss.detach())  # also waits for the step's kernels
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(value)
        bad_loss += not math.isfinite(value)
        for k in ("loss_ctc", "loss_transducer"):
            if stats.get(k) is not None:
                parts.setdefault(k, []).append(float(stats[k].detach()))
    w = max(1, min(args.window, len(losses) // 2))
    steady = times[args.warmup :] or times
    n = len(losses)
    points = sorted({min(n - 1, round(i * (n - 1) / 9)) for i in range(10)})
    row = dict(
        name="train",
        lattice=lattice,
        joint="fused" if fused else "dense",
        device=args.device,
        gpu=torch.cuda.get_device_name() if cuda else None,
        data=data["source"],
        utts=len(data["speech"]),
        batch_size=args.batch_size or margs.batch_size,
        steps=args.steps,
        steps_done=n,
        cut_by_budget=n < args.steps,
        loss_start=_mean(losses[:w]),
        loss_end=_mean(losses[-w:]),
        window=w,
        curve=[[i + 1, _mean(losses[max(0, i - w + 1) : i + 1], 4)] for i in points],
        end_parts={k: _mean(v[-w:]) for k, v in parts.items()},
        nonfinite_loss_steps=bad_loss,
        nonfinite_grad_steps=bad_grad,
        params_finite=all(bool(torch.isfinite(p).all()) for p in model.parameters()),
        first_step_s=round(times[0], 3) if times else None,
        step_ms_median=round(1000 * statistics.median(steady), 2) if steady else None,
        step_ms_p90=(
            round(1000 * float(np.percentile(steady, 90)), 2) if steady else None
        ),
        build_s=round(build_s, 2),
        run_s=round(time.perf_counter() - t_run, 2),
        model_mem_mb=round(model_mb, 1) if cuda else None,
        peak_mem_mb=(
            round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None
        ),
        losses=[round(x, 5) for x in losses],
    )
    start, end = row["loss_start"], row["loss_end"]
    row["falls"] = bool(
        n >= 2 and start is not None and end is not None and end < start
    )
    row.update(cpu_comparison(losses, data["cpu_curves"].get(lattice)))
    return row


def cpu_comparison(losses: list, curve) -> dict:
    """The recipe's CPU training (its train.log, in the data file) beside this run:
    ``cpu_curve`` [[last step, loss]] of its reports up to this run's last step, and
    the last such report's window [first, last] with the recipe's mean loss and this
    run's mean loss over the same steps (``cpu_window_loss``, ``window_loss``)."""
    if curve is None or not len(curve) or not losses:
        return {}
    done = [r for r in curve if r[1] <= len(losses)]
    out = dict(cpu_curve=[[int(r[1]), round(float(r[2]), 4)] for r in done])
    if done:
        first, last, loss = int(done[-1][0]), int(done[-1][1]), float(done[-1][2])
        out.update(
            cpu_window=[first, last],
            cpu_window_loss=round(loss, 4),
            window_loss=_mean(losses[first - 1 : last]),
        )
    return out


def _mean(xs, digits=5):
    """The mean of the finite values, rounded; None without any."""
    xs = [x for x in xs if math.isfinite(x)]
    return round(sum(xs) / len(xs), digits) if xs else None


def compare(rows: list) -> list:
    """Per lattice with both runs: dense vs fused over their first ``window`` steps
    (the largest relative difference of the losses)."""
    out = []
    for lattice in dict.fromkeys(r["lattice"] for r in rows):
        by = {r["joint"]: r for r in rows if r["lattice"] == lattice}
        if len(by) < 2:
            continue
        d, f = by["dense"]["losses"], by["fused"]["losses"]
        k = min(len(d), len(f), by["dense"]["window"])
        rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(d[:k], f[:k])]
        out.append(
            dict(
                name="train_compare",
                lattice=lattice,
                steps_compared=k,
                max_rel_diff=max(rel) if rel else None,
                step_ms_ratio=(
                    by["fused"]["step_ms_median"] / by["dense"]["step_ms_median"]
                    if by["dense"]["step_ms_median"] and by["fused"]["step_ms_median"]
                    else None
                ),
                peak_mem_ratio=(
                    by["fused"]["peak_mem_mb"] / by["dense"]["peak_mem_mb"]
                    if by["dense"]["peak_mem_mb"] and by["fused"]["peak_mem_mb"]
                    else None
                ),
            )
        )
    return out


def _write(path, rows):
    if path:
        with open(path, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    sys.stdout.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda (when available) or cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lattices", default=",".join(LATTICES))
    p.add_argument("--joints", default=",".join(JOINTS))
    p.add_argument("--data", default=DEFAULT_DATA, help="the data file (--prepare)")
    p.add_argument("--synthetic", action="store_true", help="tones, no data file")
    p.add_argument("--utts", type=int, default=256, help="--prepare / --synthetic")
    p.add_argument("--batch-size", type=int, default=0, help="0: the config's (8)")
    p.add_argument("--window", type=int, default=10, help="steps averaged")
    p.add_argument("--warmup", type=int, default=5, help="steps before timing")
    p.add_argument("--budget-s", type=float, default=0, help="0: no limit")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: as is)")
    p.add_argument("--out", help="append the JSON lines here too")
    p.add_argument("--prepare", metavar="RECIPE_DIR", help="write --data and exit")
    p.add_argument("--check-imports", action="store_true")
    args = p.parse_args(argv)

    if args.prepare:
        d = prepare(args.prepare, args.data, args.utts)
        n = len(d["keys"])
        print(
            f"{args.data}: {n} utterances, {len(d['audio']) / d['fs']:.0f} s of "
            f"audio, {len(d['text'])} words, {os.path.getsize(args.data)} bytes"
        )
        return 0
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

    failed = check_imports()
    for m, e in failed:
        print(f"import {m}: {e}", file=sys.stderr)
    if args.check_imports or failed:
        print("imports:", "all found" if not failed else f"{len(failed)} failed")
        return 1 if failed else 0

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.synthetic or not os.path.exists(args.data):
        if not args.synthetic:
            print(f"no data file {args.data}: synthetic utterances", file=sys.stderr)
        data = synthetic(SYNTHETIC_TOKENS, args.utts, seed=0)
    else:
        data = load(args.data)
    runs = [
        (lat, joint == "fused")
        for lat in args.lattices.split(",")
        for joint in args.joints.split(",")
    ]
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (lattice, fused) in enumerate(runs):
            left = args.budget_s - (time.perf_counter() - t0) if args.budget_s else 0
            share = max(5.0, left / (len(runs) - i)) if args.budget_s else 0
            if args.budget_s and left < 5:
                print(
                    f"budget spent: {lattice} {'fused' if fused else 'dense'} "
                    "not run",
                    file=sys.stderr,
                )
                continue
            row = train(lattice, fused, data, args, tmp, share)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "losses"}))
            _write(args.out, [row])  # now: a run cut by a timeout keeps the others
    comparisons = compare(rows)
    for r in comparisons:
        print(json.dumps(r), flush=True)
    _write(args.out, comparisons)
    rows += comparisons
    bad = any(
        r.get("name") == "train"
        and (r["nonfinite_loss_steps"] or not r["params_finite"])
        for r in rows
    )
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
