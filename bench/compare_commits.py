"""This checkout against a reference commit, side by side, in pairs of processes.

    .venv/bin/python bench/compare_commits.py --ref 93a0062              # dense loss
    .venv/bin/python bench/compare_commits.py --ref main --bench step    # joint + loss
    .venv/bin/python bench/compare_commits.py --ref HEAD~3 --shapes 16,100,20,64 \\
        --lattices standard,multiblank --rounds 5 --threads 1
    .venv/bin/python bench/compare_commits.py --ref 8e80b63 --bench decode \\
        --model_dir egs/digits/asr1/exp/asr_{standard,multiblank,tdt} \\
        --data egs/digits/asr1/data/test --clock cpu                    # searches

The reference commit is checked out with ``git worktree add --detach`` into a
temporary folder (removed at the end); this checkout is measured as it is on disk,
uncommitted changes included. Both run this script's ``--worker`` under the same
python, each with its own checkout first on ``PYTHONPATH`` (checked: each worker
reports the package it imported). A *round* runs one worker process per checkout, the
order alternating from round to round (A B, B A, A B, ...), so that a load change
on a noisy machine hits both alike; each worker runs every case: a warm-up call, then
``--reps`` timed calls.

Benches (``--bench``):

* ``loss`` (default): the dense loss, forward + backward w.r.t. float32 logits of
  shape (B, T, U, V) (TDT: V + 5), reduction "mean", as ``bench/loss_cpu.py`` builds
  them, timed against one ``torch.log_softmax`` over the same logits in the same
  process, interleaved call by call: the number reported per round is median(loss) /
  median(log_softmax) (the yardstick absorbs most of the machine's load);
* ``step``: one training step of the joint + loss from the joint's inputs, dense
  (``tanh(enc + pred) @ W^T + b`` then the dense loss) and fused
  (``fused_transducer_loss``, where the checkout has it), as ``bench/joint_loss.py``
  builds them; the number per round is the median step time in seconds;
* ``decode``: the transducer searches on trained models (``--model_dir``: ESPnet
  experiment directories with ``config.yaml`` and ``--model_file``) over the first
  ``--utts`` utterances of ``--data`` (a data directory with ``wav.scp``, or the
  file). Each worker loads each model once (``MultiblankSpeech2Text``), encodes the
  utterances once, untimed, and times the search alone, for every search of
  :data:`DECODE_SEARCHES`: greedy (``mb_greedy`` / ``tdt_greedy``, frame- and
  label-looping) and beam (``mb_beam`` / ``tdt_beam``, ``beam_sync`` frame, label and
  step), each built as ``Speech2Text`` builds it (``search_settings`` then
  ``build_transducer_search``: the table's defaults), at batch 1 (``search(enc)``,
  one utterance a call) and batched (``search_batch_nbest`` over ``--batch``
  utterances in the list's order, padded); and the greedy streaming searches (the
  one-utterance loop and the label-looping rows) fed ``--chunk`` encoder frames at a
  time of the chunk-masked encoder's output, a provisional hypothesis after every
  chunk but the last (as ``StreamingDecoder`` does), batch 1. The number per round
  is the median seconds per utterance (a batch's time divided by its utterances)
  over the utterances and ``--reps`` passes; with ``--metric pass``, the median over
  the passes of a whole pass's time divided by its utterances (steadier for
  searches of a few milliseconds, whose single calls move by +-8% between
  processes).

``--clock cpu`` times with the process's CPU time instead of the wall clock: on a
machine that other processes load, waiting for a core then does not count (the
caches they share still do).

Output: per case, the number of each round for both checkouts, their medians over the
rounds, and two ratios this / reference: of the medians, and the median of the
per-round ratios (each round's pair measured back to back). Below 1: this checkout is
faster. ``--out`` also writes every round as JSON lines.

Lattices: ``standard`` (blank 0), ``multiblank`` (big blanks [2, 4, 8], blank V - 1),
``tdt`` (durations [0, 1, 2, 3, 4], blank 0). Shapes: (B, T, U, V) for ``loss`` (U =
label positions, labels + 1), (B, T, U, J, V) for ``step`` (U = labels).
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LATTICES = {
    "standard": dict(big=(), tdt=None),
    "multiblank": dict(big=(2, 4, 8), tdt=None),
    "tdt": dict(big=(), tdt=(0, 1, 2, 3, 4)),
}
#: the decode bench's searches: name -> (transducer_conf without the search type,
#: the search type's family: mb_ or tdt_ + "greedy" / "beam" as the model's lattice,
#: how it runs: one utterance (or a batch) at a time, or streaming)
DECODE_SEARCHES = {
    "greedy frame": ({}, "greedy", "offline"),
    "greedy label": (dict(loop_labels=True), "greedy", "offline"),
    "beam frame": (dict(beam_sync="frame"), "beam", "offline"),
    "beam label": (dict(beam_sync="label"), "beam", "offline"),
    "beam step": (dict(beam_sync="step"), "beam", "offline"),
    "stream frame": ({}, "greedy", "stream"),
    "stream label": ({}, "greedy", "stream"),
}
DEFAULT_SHAPES = {
    "loss": ["16,100,20,64", "4,150,40,128"],
    "step": ["8,300,60,320,1024"],
}


# ------------------------------------------------------------------------ the worker
def _loss_case(shape, lattice):
    """(loss run, yardstick run) of the dense loss on float32 logits."""
    import torch

    from espnet_multiblank import multiblank_rnnt_loss, tdt_loss

    B, T, U, V = shape
    spec = LATTICES[lattice]
    gen = torch.Generator().manual_seed(0)
    D = len(spec["tdt"]) if spec["tdt"] else 0
    logits = torch.randn(B, T, U, V + D, generator=gen)
    if spec["big"]:
        blank = V - 1
        labels = torch.randint(0, V - 4, (B, U - 1), generator=gen, dtype=torch.int32)
    else:
        blank = 0
        labels = torch.randint(1, V, (B, U - 1), generator=gen, dtype=torch.int32)
    act_lens = torch.full((B,), T, dtype=torch.int32)
    label_lens = torch.full((B,), U - 1, dtype=torch.int32)

    def loss_fn(x):
        if spec["tdt"]:
            return tdt_loss(
                x, labels, act_lens, label_lens, blank, spec["tdt"], reduction="mean"
            )
        return multiblank_rnnt_loss(
            x, labels, act_lens, label_lens, blank, spec["big"], "mean"
        )

    def run():
        x = logits.detach().requires_grad_(True)
        loss_fn(x).backward()

    def yardstick():
        torch.log_softmax(logits, dim=-1)

    return run, yardstick


def _step_case(shape, lattice, path):
    """A training step (forward + backward from the joint's inputs), dense or
    fused."""
    import torch

    import espnet_multiblank as em

    B, T, U, J, V = shape
    spec = LATTICES[lattice]
    Vp = V + (len(spec["tdt"]) if spec["tdt"] else 0)
    gen = torch.Generator().manual_seed(0)
    enc = torch.randn(B, T, J, generator=gen)
    pred = torch.randn(B, U + 1, J, generator=gen)
    weight = torch.randn(Vp, J, generator=gen) / J**0.5
    bias = torch.randn(Vp, generator=gen) * 0.1
    if spec["big"]:
        blank = V - 1
        labels = torch.randint(0, V - 4, (B, U), generator=gen)
    else:
        blank = 0
        labels = torch.randint(1, V, (B, U), generator=gen)
    leaves = [x.requires_grad_(True) for x in (enc, pred, weight, bias)]
    enc, pred, weight, bias = leaves
    act_lens, label_lens = torch.full((B,), T), torch.full((B,), U)

    if path == "fused":
        if not hasattr(em, "fused_transducer_loss"):
            return None

        def run():
            for x in leaves:
                x.grad = None
            em.fused_transducer_loss(
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
            ).backward()

        return run

    def run():
        for x in leaves:
            x.grad = None
        h = torch.tanh(enc[:, :, None] + pred[:, None])
        z = torch.nn.functional.linear(h, weight, bias)
        del h
        if spec["tdt"]:
            loss = em.tdt_loss(z, labels, act_lens, label_lens, blank, spec["tdt"])
        else:
            loss = em.multiblank_rnnt_loss(
                z, labels, act_lens, label_lens, blank, spec["big"]
            )
        del z
        loss.backward()

    return run


def _wav_list(data: str, utts: int):
    """The first ``utts`` (key, wav path) of ``data`` (a data dir or its wav.scp)."""
    scp = os.path.join(data, "wav.scp") if os.path.isdir(data) else data
    with open(scp, encoding="utf-8") as f:
        entries = [line.split(maxsplit=1) for line in f if line.strip()]
    return [(key, path.strip()) for key, path in entries[:utts]]


class _DecodeModel:
    """One trained model, loaded once, with its utterances encoded once (untimed):
    ``encs`` (T_i, D_enc) full context and, for the streaming cases,
    ``chunk_encs`` with the chunk-masked encoder (``chunk`` frames a chunk)."""

    def __init__(self, model_dir: str, model_file: str, data: str, utts: int):
        import soundfile
        import torch

        from espnet_multiblank.espnet.inference.search import lattice_from_model
        from espnet_multiblank.espnet.inference.speech2text import (
            MultiblankSpeech2Text,
        )

        s2t = MultiblankSpeech2Text(  # mb_greedy: tdt_greedy for a TDT
            asr_train_config=os.path.join(model_dir, "config.yaml"),
            asr_model_file=os.path.join(model_dir, model_file),
            transducer_conf={"search_type": "mb_greedy"},
            beam_size=1,
            nbest=1,
            device="cpu",
        )
        self.model = s2t.asr_model.eval()
        self.prefix = "tdt" if lattice_from_model(self.model).kind == "tdt" else "mb"
        self.waves = [
            torch.from_numpy(soundfile.read(path, dtype="float32")[0])
            for _, path in _wav_list(data, utts)
        ]
        self.encs = self._encode()
        self.chunk_encs = {}

    def _encode(self):
        import torch

        out = []
        with torch.no_grad():
            for wave in self.waves:
                enc, lens = self.model.encode(wave[None], torch.tensor([wave.numel()]))
                enc = enc[0] if isinstance(enc, tuple) else enc
                out.append(enc[0, : int(lens[0])])
        return out

    def chunked(self, chunk: int):
        """The chunk-masked encoder's outputs (what a stream's encoder gives)."""
        if chunk not in self.chunk_encs:
            encoder = self.model.encoder
            offline = encoder.decoding_chunk_size
            encoder.set_decoding_chunk(chunk, None)
            self.chunk_encs[chunk] = self._encode()
            encoder.set_decoding_chunk(offline, None)
        return self.chunk_encs[chunk]

    def search(self, name: str):
        """The search ``name`` of :data:`DECODE_SEARCHES`, built as ``Speech2Text``
        builds it (the table's defaults filled in)."""
        from espnet_multiblank.espnet.inference.search import build_transducer_search
        from espnet_multiblank.espnet.inference.search_defaults import (
            search_settings,
        )

        conf, family, _ = DECODE_SEARCHES[name]
        tconf = dict(conf, search_type=f"{self.prefix}_{family}")
        search_type, beam_size, rest = search_settings(tconf)
        return build_transducer_search(
            self.model,
            beam_size=beam_size,
            search_type=search_type,
            nbest=1,
            token_list=list(self.model.token_list),
            **rest,
        )


def _decode_runs(dm: _DecodeModel, case):
    """The timed calls of a decode case, each ``(fn, utterances)``."""
    import torch

    name, batch = case["search"], case["batch"]
    search = dm.search(name)
    if DECODE_SEARCHES[name][2] == "stream":
        return _stream_runs(dm, search, name, case["chunk"])
    encs = dm.encs
    if batch == 1:
        return [(functools.partial(search, enc), 1) for enc in encs]
    runs = []
    for i in range(0, len(encs), batch):
        group = encs[i : i + batch]
        lens = torch.tensor([e.size(0) for e in group])
        padded = torch.nn.utils.rnn.pad_sequence(group, batch_first=True)
        fn = functools.partial(search.search_batch_nbest, padded, lens)
        runs.append((fn, len(group)))
    return runs


def _stream_runs(dm: _DecodeModel, search, name: str, chunk: int):
    """A greedy streaming search of one stream per utterance (the one-utterance
    loop, or the label-looping rows), fed ``chunk`` frames at a time."""
    from espnet_multiblank.decoding.streaming import (
        StreamingGreedySearch,
        StreamingRowGreedySearch,
    )
    from espnet_multiblank.espnet.inference.streaming import streaming_search

    one_loop = name == "stream frame"
    search = streaming_search(search, dm.model, one_loop=one_loop)
    kind = StreamingRowGreedySearch if one_loop else StreamingGreedySearch
    rows = kind(search, 1, "cpu")
    projected = [search.stepper.project_enc(e) for e in dm.chunked(chunk)]

    def stream(ep):
        rows.reset([0])
        for i in range(0, ep.size(0), chunk):
            last = i + chunk >= ep.size(0)
            rows.append(0, ep[i : i + chunk], final=last)
            rows.advance()
            if not last:
                rows.provisional([0])
        return rows.hypothesis(0)

    return [(functools.partial(stream, ep), 1) for ep in projected]


def _decode_worker(cases, reps: int):
    """The decode cases: models loaded and utterances encoded once per model."""
    import torch

    models = {}
    for case in cases:
        key = (case["model_dir"], case["model_file"], case["data"], case["utts"])
        if key not in models:
            models = {key: _DecodeModel(*key)}  # one model in memory at a time
        dm = models[key]
        value = None
        with torch.no_grad():
            try:
                runs = _decode_runs(dm, case)
            except (ValueError, TypeError) as e:  # a search this checkout lacks
                print(f"{case['name']}: {e}", file=sys.stderr)
                runs = None
            if runs:
                runs[0][0]()  # warm-up
                passes = [[(_time(fn), n) for fn, n in runs] for _ in range(reps)]
                value = decode_value(passes, case["metric"])
        print(json.dumps({"case": case["name"], "value": value}), flush=True)


def decode_value(passes, metric: str) -> float:
    """A decode case's number from its timed passes (each a list of ``(seconds,
    utterances)``, one per call): ``"utterance"``, the median of every call's seconds
    per utterance; ``"pass"``, the median over the passes of a whole pass's seconds
    per utterance (steadier for millisecond searches: one slow call weighs its
    share)."""
    if metric == "pass":
        return statistics.median(
            sum(t for t, _ in calls) / sum(n for _, n in calls) for calls in passes
        )
    return statistics.median(t / n for calls in passes for t, n in calls)


#: the clock of the timings: wall time, or the process's CPU time (user + system,
#: all its threads: less sensitive to other processes on a loaded machine)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def _time(fn) -> float:
    t0 = _clock()
    fn()
    return _clock() - t0


def worker(cases, threads: int, reps: int) -> None:
    """Run every case (warm-up, then ``reps`` timed calls) and print one JSON line
    per case: ``{"case", "value"}`` (None: not available in this checkout)."""
    import torch

    import espnet_multiblank

    torch.set_num_threads(threads)
    print(json.dumps({"package": os.path.dirname(espnet_multiblank.__file__)}))
    if cases and cases[0]["bench"] == "decode":
        _decode_worker(cases, reps)
        return
    for case in cases:
        bench, lattice, shape = case["bench"], case["lattice"], tuple(case["shape"])
        if bench == "loss":
            run, yardstick = _loss_case(shape, lattice)
            run(), yardstick()
            t_run, t_ls = [], []
            for _ in range(reps):
                t_ls.append(_time(yardstick))
                t_run.append(_time(run))
            value = statistics.median(t_run) / statistics.median(t_ls)
        else:
            run = _step_case(shape, lattice, case["path"])
            value = None
            if run is not None:
                run()
                value = statistics.median(_time(run) for _ in range(reps))
        print(json.dumps({"case": case["name"], "value": value}), flush=True)


# ------------------------------------------------------------------------ the parent
def _git(*args, cwd=ROOT) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _decode_cases(args):
    if not args.model_dir or not args.data:
        raise SystemExit("--bench decode needs --model_dir and --data")
    searches = args.searches.split(",") if args.searches else list(DECODE_SEARCHES)
    unknown = sorted(set(searches) - set(DECODE_SEARCHES))
    if unknown:
        known = ", ".join(DECODE_SEARCHES)
        raise SystemExit(f"--searches: unknown {unknown}; known: {known}")
    cases = []
    for model_dir in args.model_dir:
        model_dir = os.path.abspath(model_dir)
        for search in searches:
            stream = DECODE_SEARCHES[search][2] == "stream"
            for batch in [1] if stream else sorted({1, args.batch}):
                cases.append(
                    dict(
                        name=f"{os.path.basename(model_dir)} {search} b{batch}",
                        bench="decode",
                        model_dir=model_dir,
                        model_file=args.model_file,
                        data=os.path.abspath(args.data),
                        utts=args.utts,
                        search=search,
                        batch=batch,
                        chunk=args.chunk,
                        metric=args.metric,
                    )
                )
    return cases


def _cases(args):
    if args.bench == "decode":
        return _decode_cases(args)
    cases = []
    for lattice in args.lattices.split(","):
        for text in args.shapes or DEFAULT_SHAPES[args.bench]:
            shape = [int(v) for v in text.split(",")]
            want = 4 if args.bench == "loss" else 5
            if len(shape) != want:
                raise SystemExit(f"--shapes: {args.bench} shapes have {want} numbers")
            paths = ["loss"] if args.bench == "loss" else ["dense", "fused"]
            for path in paths:
                name = f"{lattice} {tuple(shape)}"
                if args.bench == "step":
                    name += f" {path}"
                cases.append(
                    dict(
                        name=name,
                        bench=args.bench,
                        lattice=lattice,
                        shape=shape,
                        path=path,
                    )
                )
    return cases


def _run_worker(checkout: str, cases, args):
    env = dict(os.environ)
    env["PYTHONPATH"] = checkout + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
    cmd += ["--threads", str(args.threads), "--reps", str(args.reps)]
    cmd += ["--clock", args.clock]
    proc = subprocess.run(
        cmd,
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker for {checkout} failed:\n{proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    package = lines[0]["package"]
    if os.path.dirname(os.path.realpath(package)) != os.path.realpath(checkout):
        raise SystemExit(f"the worker for {checkout} imported {package}")
    return {x["case"]: x["value"] for x in lines[1:]}


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", help="the reference commit (any git ref; required)")
    ap.add_argument("--bench", choices=("loss", "step", "decode"), default="loss")
    ap.add_argument("--shapes", nargs="*", help="B,T,U,V (loss) or B,T,U,J,V (step)")
    ap.add_argument("--lattices", default="standard,multiblank")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=None, help="timed calls per worker")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="wall or CPU time"
    )
    ap.add_argument("--out", help="JSON lines of every round")
    dec = ap.add_argument_group("decode")
    dec.add_argument("--model_dir", nargs="+", help="experiment dirs (config.yaml)")
    dec.add_argument("--model_file", default="valid.loss.ave.pth")
    dec.add_argument("--data", help="a data dir with wav.scp, or the wav.scp")
    dec.add_argument("--utts", type=int, default=50, help="its first N utterances")
    dec.add_argument("--batch", type=int, default=8, help="the batched cases' size")
    dec.add_argument("--chunk", type=int, default=16, help="streaming: frames a chunk")
    dec.add_argument("--searches", help="comma-separated names (default: all)")
    dec.add_argument(
        "--metric",
        choices=("utterance", "pass"),
        default="utterance",
        help="a round's number: the median call's ms per utterance, or the median "
        "pass's (all the utterances' time / their number)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reps is None:
        args.reps = {"loss": 15, "step": 3, "decode": 1}[args.bench]
    if args.worker:
        global _clock
        _clock = CLOCKS[args.clock]
        worker(json.load(sys.stdin), args.threads, args.reps)
        return
    if not args.ref:
        ap.error("--ref is required")

    cases = _cases(args)
    sha = _git("rev-parse", "--short", args.ref)
    head = _git("rev-parse", "--short", "HEAD")
    dirty = " + uncommitted changes" if _git("status", "--porcelain", "-uno") else ""
    tmp = tempfile.mkdtemp(prefix="compare_commits_")
    ref_dir = os.path.join(tmp, "ref")
    _git("worktree", "add", "--detach", ref_dir, sha)
    print(f"this checkout: {ROOT} (HEAD {head}{dirty}); reference: {sha}")
    print(f"load average before: {os.getloadavg()}")
    out = open(args.out, "a") if args.out else None
    results = {"this": [], "ref": []}
    try:
        for r in range(args.rounds):
            order = [("this", ROOT), ("ref", ref_dir)]
            if r % 2:
                order.reverse()
            for who, checkout in order:
                res = _run_worker(checkout, cases, args)
                results[who].append(res)
                if out:
                    out.write(json.dumps(dict(round=r, who=who, results=res)) + "\n")
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}")
    finally:
        _git("worktree", "remove", "--force", ref_dir)
        os.rmdir(tmp)
        if out:
            out.close()
    per = "of a pass" if args.metric == "pass" else "of a call"
    unit = {"loss": "x log_softmax", "step": "s", "decode": f"ms per utterance {per}"}
    unit = unit[args.bench]
    scale = 1000.0 if args.bench == "decode" else 1.0
    print(f"load average after: {os.getloadavg()}")
    calls = f"{args.reps} calls"
    if args.bench == "decode":
        calls = f"{args.reps} pass(es) over {args.utts} utterances"
    print(
        f"\n{args.bench}, {args.threads} thread(s), {args.clock} clock, {args.rounds} "
        f"rounds x {calls}; per round: median ({unit}); this / ref < 1: faster\n"
    )
    print("| case | this, rounds | ref, rounds | this | ref | this/ref | pairs |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        name = case["name"]
        a = [res[name] for res in results["this"]]
        b = [res[name] for res in results["ref"]]
        a, b = ([None if v is None else v * scale for v in x] for x in (a, b))
        if None in a or None in b:
            print(f"| {name} | not available in one checkout |||||")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        pairs = statistics.median(x / y for x, y in zip(a, b))
        print(
            f"| {name} | {' '.join(map(_fmt, a))} | {' '.join(map(_fmt, b))} | "
            f"{ma:.3f} | {mb:.3f} | {ma / mb:.3f} | {pairs:.3f} |"
        )


if __name__ == "__main__":
    main()
