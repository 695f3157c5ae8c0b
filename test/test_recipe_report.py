"""Unit checks of the recipe's report (egs/digits/asr1/local/make_report.py and the
section modules in local/report/)."""

import importlib
import sys
from pathlib import Path
from unittest import mock

import pytest

LOCAL = Path(__file__).resolve().parents[1] / "egs/digits/asr1/local"


def import_local(name: str):
    """A module of the recipe's local/ (``make_report``, ``report.*``), imported as
    make_report.py does: with local/ first on sys.path."""
    sys.path.insert(0, str(LOCAL))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(LOCAL))


@pytest.fixture(scope="module")
def make_report():
    """The stage-times section (its run_span), imported as make_report.py does."""
    sys.path.insert(0, str(LOCAL))
    try:
        yield importlib.import_module("report.stages")
    finally:
        sys.path.remove(str(LOCAL))


def write_markers(done: Path, stages):
    done.mkdir()
    for n, (finish, secs) in stages.items():
        (done / str(n)).write_text(f"{finish}, {secs} s\n")


def test_run_span_covers_parallel_stages(make_report, tmp_path):
    """Stages 6, 7, 8 and 9 run side by side: the span is first start to last
    finish, not the sum of the stage times (here 09:00:00 - 10 s to 09:30:00)."""
    stages = {k: (f"2026-01-01T09:00:{k:02d}", 1) for k in range(1, 6)}
    stages[1] = ("2026-01-01T09:00:00", 10)
    stages[6] = ("2026-01-01T09:20:00", 1000)
    stages[7] = ("2026-01-01T09:20:05", 1000)
    stages[8] = ("2026-01-01T09:20:03", 1000)
    stages[9] = ("2026-01-01T09:20:02", 1000)
    stages[10] = ("2026-01-01T09:21:00", 55)
    stages[11] = ("2026-01-01T09:25:00", 240)
    stages[12] = ("2026-01-01T09:29:59", 299)
    stages[13] = ("2026-01-01T09:29:59", 100)
    stages[14] = ("2026-01-01T09:29:59", 50)
    stages[15] = ("2026-01-01T09:30:00", 1)
    write_markers(tmp_path / "done", stages)
    assert make_report.run_span(str(tmp_path / "done")) == pytest.approx(1810.0)
    # stage 9 (the models for sherpa-onnx) is optional: without it, the same span
    (tmp_path / "done" / "9").unlink()
    assert make_report.run_span(str(tmp_path / "done")) == pytest.approx(1810.0)


def test_busy_time_leaves_out_the_gap_between_invocations(make_report, tmp_path):
    """Stages 1-9 in one invocation (08:59:50 to 09:20:05, 6-9 side by side), 10-15
    in another an hour later (10:19:05 to 10:30:00): the busy time is the union of
    the stages' intervals, the span runs from the first start to the last finish.
    Worked out by hand."""
    stages = {k: (f"2026-01-01T09:00:{k:02d}", 1) for k in range(2, 6)}
    stages[1] = ("2026-01-01T09:00:00", 10)
    stages[6] = ("2026-01-01T09:20:00", 1000)
    stages[7] = ("2026-01-01T09:20:05", 1000)
    stages[8] = ("2026-01-01T09:20:03", 1000)
    stages[9] = ("2026-01-01T09:20:02", 1000)
    stages[10] = ("2026-01-01T10:20:00", 55)
    stages[11] = ("2026-01-01T10:25:00", 240)  # from 10:21:00: 60 s after stage 10
    stages[12] = ("2026-01-01T10:29:59", 299)
    stages[13] = ("2026-01-01T10:29:59", 100)
    stages[14] = ("2026-01-01T10:29:59", 50)
    stages[15] = ("2026-01-01T10:30:00", 1)
    (tmp_path / "exp").mkdir()
    write_markers(tmp_path / "exp" / ".done", stages)
    done = str(tmp_path / "exp" / ".done")
    # the union of the intervals: [08:59:50, 09:00:00] (stage 1), [09:00:01,
    # 09:00:05] (2-5), [09:03:20, 09:20:05] (6-9), [10:19:05, 10:20:00] (10),
    # [10:21:00, 10:30:00] (11-15)
    busy = 10 + 4 + 1005 + 55 + 540
    assert make_report.busy_time(done) == pytest.approx(busy)
    assert make_report.run_span(done) == pytest.approx(90 * 60 + 10)
    line = [x for x in make_report.section(str(tmp_path / "exp")) if "Stages 1-" in x]
    assert "first start to last finish: 90.2 min" in line[0]
    assert "separate invocations: 26.9 min" in line[0]


def test_run_span_needs_every_stage(make_report, tmp_path):
    stages = {k: (f"2026-01-01T09:00:{k:02d}", 1) for k in range(1, 15)}  # no 15
    write_markers(tmp_path / "done", stages)
    assert make_report.run_span(str(tmp_path / "done")) is None
    (tmp_path / "done" / "15").write_text("garbled\n")
    assert make_report.run_span(str(tmp_path / "done")) is None


@pytest.fixture(scope="module")
def report_modules():
    sys.path.insert(0, str(LOCAL))
    try:
        yield (
            importlib.import_module("report.repeats"),
            importlib.import_module("report.speed_plot"),
        )
    finally:
        sys.path.remove(str(LOCAL))


def test_repeated_digit_subset(report_modules, tmp_path):
    """Utterances with two adjacent identical words, and the WER on them and on the
    others, counted by hand here."""
    repeats, _ = report_modules
    assert repeats.has_repeat("one five five".split())
    assert not repeats.has_repeat("five one five".split())
    assert not repeats.has_repeat(["five"]) and not repeats.has_repeat([])
    data, exp = tmp_path / "data", tmp_path / "exp"
    (data / "test").mkdir(parents=True)
    (data / "test" / "text").write_text(
        "u1 one one two\nu2 three four\nu3 five six six six\nu4 oh\n"
    )
    out = exp / "asr_m" / "decode_g_valid.loss.ave" / "test" / "1best_recog"
    out.mkdir(parents=True)
    # u1: one deletion (the repeat merged); u3: one substitution; u4: missing
    (out / "text").write_text("u1 one two\nu2 three four\nu3 five six six seven\n")
    res, n_rep, n_all = repeats.load(
        str(exp), str(data), [("m", "g")], "test", "valid.loss.ave"
    )
    assert (n_rep, n_all) == (2, 4)
    (w_rep, words_rep), (w_rest, words_rest) = res["m", "g"]
    assert (words_rep, words_rest) == (7, 3)
    assert w_rep == pytest.approx(100 * 2 / 7)
    assert w_rest == pytest.approx(100 * 1 / 3)
    lines = repeats.section(str(exp), str(data), [("m", "g")], "test", "valid.loss.ave")
    assert "| m | g | 28.57% | 33.33% |" in lines


def test_wer_vs_search_time_plot(report_modules, tmp_path):
    _, speed_plot = report_modules
    res = {
        ("a", "greedy", "test"): ({"wer": 9.0}, {"search_seconds": 2.0}),
        ("a", "beam", "test"): ({"wer": 8.0}, {"search_seconds": 20.0}),
        ("b", "greedy", "test"): ({"wer": 7.5}, {"search_seconds": 0.5}),
        ("b", "beam", "test"): (None, {"search_seconds": 5.0}),  # not scored
    }
    jobs = [("a", "greedy"), ("a", "beam"), ("b", "greedy"), ("b", "beam")]
    out = tmp_path / "p.png"
    pts = speed_plot.plot(res, jobs, "test", str(out))
    assert pts == [
        ("a", "greedy", 2.0, 9.0),
        ("a", "beam", 20.0, 8.0),
        ("b", "greedy", 0.5, 7.5),
    ]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_labels_avoid_each_other_and_ticks_are_plain_seconds(report_modules):
    """Neighbouring points (the standard model's greedy and mb_greedy at the same
    WER, as in the recipe's run): no two search names overlap, none covers another
    marker, and the log axis is labelled with plain 1-2-5 seconds only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, speed_plot = report_modules
    pts = [
        ("standard", "greedy", 0.85, 7.30),
        ("standard", "mb_greedy", 0.8, 7.28),
        ("standard", "beam", 7.1, 7.38),
        ("multiblank", "mb_greedy", 0.6, 8.03),
        ("multiblank", "mb_beam", 9.0, 7.98),
        ("tdt", "tdt_greedy", 0.5, 5.62),
        ("tdt", "tdt_beam", 5.0, 5.42),
    ]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for _, _, secs, wer in pts:
        ax.scatter([secs], [wer], s=50)
    ax.set_xscale("log")
    labels = speed_plot.place_labels(ax, fig, pts)
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_window_extent(renderer) for a in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert speed_plot._overlap(a, b) == 0
        for j, (_, _, secs, wer) in enumerate(pts):
            x, y = ax.transData.transform((secs, wer))
            if j != i:
                assert not (a.x0 < x < a.x1 and a.y0 < y < a.y1)
    plt.close(fig)
    assert speed_plot.nice_ticks(0.4, 11) == [0.5, 1, 2, 5, 10]
    assert speed_plot.nice_ticks(3.1, 3.9) == [3.1, 3.9]
    assert [speed_plot.plain_seconds(v) for v in (0.5, 1.0, 20.0)] == ["0.5", "1", "20"]


def test_lm_weight_choice_and_section(tmp_path):
    """The weight of the lowest dev WER (ties: the smaller), and the LM section's
    rows and goal lines from hand-written score files."""
    import json

    sys.path.insert(0, str(LOCAL))
    try:
        choose = importlib.import_module("choose_lm_weight")
        lm = importlib.import_module("report.lm")
    finally:
        sys.path.remove(str(LOCAL))
    assert choose.choose({"0.4": 5.0, "0.1": 6.0, "0.2": 5.0}) == "0.2"
    # weight 0 (no LM) takes part: an LM that does not lower the dev WER is not used
    for no_lm, want in ((5.0, "0"), (6.5, "0.1")):
        paths = {}
        for w, wer in (("no_lm", no_lm), ("0.1", 6.0), ("0.2", 7.0)):
            paths[w] = tmp_path / f"dev_{w}_{no_lm}.json"
            paths[w].write_text(json.dumps({"wer": wer}))
        out = tmp_path / f"chosen_{no_lm}.json"
        argv = ["choose_lm_weight.py", "--no_lm", str(paths["no_lm"]), str(out)]
        argv += [f"{w}={paths[w]}" for w in ("0.1", "0.2")]
        with mock.patch.object(sys, "argv", argv):
            choose.main()
        got = json.loads(out.read_text())
        assert got == {
            "chosen": want,
            "dev_wer": {"0.1": 6.0, "0.2": 7.0},
            "no_lm_wer": no_lm,
        }
    exp, im = tmp_path / "exp", "valid.loss.ave"
    (exp / "lm_train").mkdir(parents=True)

    def score(path, wer):
        path.mkdir(parents=True)
        (path / "score.json").write_text(json.dumps({"wer": wer}))

    # (model, lm, chosen weight, WER without, WER with) on the first test set
    for m, name, w, plain, fused in (
        ("a", "train", "0.1", 8.0, 8.1),
        ("b", "train", "0.2", 6.0, 6.3),
        ("a", "known", "0.4", 9.0, 4.0),
        ("b", "known", "0.8", 7.0, 7.0),
    ):
        s = "test" if name == "train" else "test_known"
        score(Path(lm.decode_dir(str(exp), m, "s", im)) / s, plain)
        score(Path(lm.decode_dir(str(exp), m, "s", im, name, w)) / s, fused)
        (exp / f"asr_{m}" / f"lm_{name}_weight_s_{im}.json").write_text(
            json.dumps({"chosen": w, "dev_wer": {w: 1.0}, "no_lm_wer": 2.0})
        )
    lines = lm.section(
        str(exp), str(tmp_path / "data"), [("a", "s"), ("b", "s")], im, ["test"]
    )
    assert "| a | s | 2.00% | 1.00% | - | 0.1 | 8.00% -> 8.10% (+0.10) |" in lines
    known = [line for line in lines if line.startswith("- known-list")][0]
    assert "**no** (1 of 2:" in known  # b is not lowered
    test = [line for line in lines if line.startswith("- `test`")][0]
    assert "**no**" in test and "b 6.00% -> 6.30% (+0.30)" in test  # +0.3 > 0.2


def test_half_precision_section(tmp_path):
    """Utterances whose float16 hypothesis differs from float32's, counted by hand."""
    import json

    precision = import_local("report.precision")
    im = "valid.loss.ave"
    for name, lines, wer, batch in (
        (f"decode_g_{im}", "u1 4 5\nu2 6\nu3 \n", 10.0, 1),
        (f"decode_g_float16_{im}", "u1 4 5\nu2 7\nu3 \n", 12.5, 32),
        (f"decode_g_bfloat16_{im}", "u1 4 5\nu2 6\nu3 \n", 10.0, 1),
    ):
        d = tmp_path / "asr_m" / name / "test"
        (d / "1best_recog").mkdir(parents=True)
        (d / "1best_recog" / "token_int").write_text(lines)
        (d / "score.json").write_text(json.dumps({"wer": wer}))
        stats = {"num_failed": 0, "batch_size": batch}
        (d / "decoding_stats.json").write_text(json.dumps(stats))
    lines = precision.section(
        str(tmp_path), [("m", "g")], ["float16", "bfloat16"], im, "test"
    )
    assert "| m | g | float16 | 32 | 10.00% | 12.50% | 1 / 3 | 0 |" in lines
    assert "| m | g | bfloat16 | 1 | 10.00% | 10.00% | 0 / 3 | 0 |" in lines
    assert any("every search and dtype: **no**" in line for line in lines)


def test_throughput_section(tmp_path):
    """Utterances per second from the decoding stats the two entry points write, the
    ratio to the first (stock, batch 1) row and the goal line, computed by hand."""
    import json

    throughput = import_local("report.throughput")
    jobs = [
        ("standard", "greedy", "1", "stock"),
        ("multiblank", "mb_greedy", "32", "plugin"),
        ("tdt", "tdt_greedy", "32", "plugin"),  # not decoded: no row
    ]
    for job, secs, wer in ((jobs[0], 10.0, 8.5), (jobs[1], 4.0, 7.5)):
        d = Path(throughput.job_dir(str(tmp_path), job, "valid.loss.ave", "test"))
        d.mkdir(parents=True)
        (d / "decoding_stats.json").write_text(
            json.dumps({"num_utterances": 500, "decode_seconds": secs})
        )
        (d / "score.json").write_text(json.dumps({"wer": wer}))
    rows = throughput.load(str(tmp_path), jobs, "valid.loss.ave", "test")
    decode_res = {("multiblank", "mb_greedy", "test"): ({"wer": 7.5}, {})}
    lines = throughput.section(rows, "test", decode_res)
    table = [line for line in lines if line.startswith("| standard")]
    assert table and "| 50.0 | 1.00x |" in table[0]
    mb = [line for line in lines if line.startswith("| multiblank")]
    assert mb and "| 7.50% | 7.50% | 4.00 s | 125.0 | 2.50x |" in mb[0]
    assert not [line for line in lines if line.startswith("| tdt")]
    goal = [line for line in lines if "goal >= 2.0x" in line]
    assert goal and "**2.50x**" in goal[0] and ": yes)" in goal[0]


def test_procs_section(tmp_path):
    """Time per epoch (median of train + valid time=), best valid loss, WER per run;
    with several seeds the mean WER per number of processes, its difference to 1
    process, the goal verdict and the 1-process seeds' spread, from hand-written ESPnet
    logs."""
    import json

    procs = import_local("report.procs")
    runs = []
    for n, seed, times, losses, wer in (
        (1, 0, [(30.0, 2.0), (31.0, 2.0), (40.0, 3.0)], [5.0, 4.0, 4.5], 8.0),
        (2, 0, [(20.0, 1.0), (22.0, 1.0), (21.0, 1.0)], [5.1, 4.2, 4.1], 8.25),
        (1, 1, [(30.0, 1.0), (30.0, 1.0), (30.0, 1.0)], [5.0, 4.4, 4.3], 7.5),
        (2, 1, [(20.0, 2.0), (20.0, 2.0), (20.0, 2.0)], [5.0, 4.4, 4.3], 8.75),
    ):
        train = tmp_path / f"p{n}s{seed}" / "exp" / "asr_multiblank"
        train.mkdir(parents=True)
        lines = [
            f"[vm] 2026 (trainer:394) INFO: {e + 1}epoch results: [train] "
            f"loss=9.0, time={tr} seconds, total_count=10, [valid] loss={lo}, "
            f"time={va} seconds, total_count=2"
            for e, ((tr, va), lo) in enumerate(zip(times, losses))
        ]
        (train / "train.log").write_text("\n".join(lines) + "\n")
        (train / "train_seconds").write_text("100\n")
        dec = tmp_path / f"p{n}s{seed}" / "decode"
        dec.mkdir()
        (dec / "score.json").write_text(json.dumps({"wer": wer}))
        runs.append(procs.row(n, seed, str(train), str(dec)))
    assert runs[0]["per_epoch"] == pytest.approx(33.0)  # median of 32, 33, 43
    assert runs[1]["per_epoch"] == pytest.approx(22.0)  # median of 21, 23, 22
    assert runs[0]["best_valid"] == 4.0 and runs[1]["best_valid"] == 4.1
    lines = procs.section(runs, "multiblank", "mb_greedy", "test")
    per_run = [line for line in lines if line.startswith("| 2 | 0 |")]
    assert per_run == ["| 2 | 0 | 3 | 22.0 s | 100.0 s | 4.100 | 8.25% |"]
    # means: 1 process (8.0 + 7.5) / 2 = 7.75, 2 processes (8.25 + 8.75) / 2 = 8.5
    means = [line for line in lines if line.startswith("| 2 | 2 |")]
    assert means == ["| 2 | 2 | 8.50% | 8.25-8.75% | 22.0 s | +0.75 |"]
    verdict = [line for line in lines if line.startswith("- 2 processes")]
    assert verdict == [
        "- 2 processes: mean WER +0.75 absolute against 1 process "
        "(goal within +-0.5: no); the 2 seeds of 1 process span 0.50."
    ]
    # one seed each: no spread claimed
    one = procs.section(runs[:2], "multiblank", "mb_greedy", "test")
    assert [line for line in one if line.startswith("- 2 processes")] == [
        "- 2 processes: mean WER +0.25 absolute against 1 process "
        "(goal within +-0.5: yes)."
    ]


def test_training_section_says_how_many_ddp_processes(tmp_path):
    """A run with --train_procs 2 says its models were trained with 2 DDP processes;
    a 1-process run keeps the plain wording."""
    training = import_local("report.training")
    line = (
        "[vm] 2026 (trainer:394) INFO: 1epoch results: [train] loss=9.0, "
        "total_count=10, [valid] loss=4.0, total_count=2\n"
    )
    for procs in (2, 1):
        exp = tmp_path / f"procs{procs}"
        for m in ("standard", "multiblank"):
            d = exp / f"asr_{m}"
            d.mkdir(parents=True)
            (d / "train.log").write_text(line)
            (d / "train_seconds").write_text("10\n")
            (d / "train_procs").write_text(f"{procs}\n")
        text = "\n".join(training.section(str(exp), ["standard", "multiblank"], 3)[0])
        ddp = "Each model was trained with 2 DDP processes on this machine"
        assert (ddp in text) == (procs == 2)
        per = "one torch thread per process" if procs == 2 else "one torch thread each"
        assert f"at most 3 at a time, {per} (" in text


def test_score_times_against_hand_computed_errors(tmp_path):
    """Word start errors and emission delays over the matching words of a minimum-cost
    alignment, computed by hand; an inserted and a substituted word are not counted."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "score_times", LOCAL / "score_times.py"
    )
    st = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(st)
    ref = tmp_path / "word_times"
    ref.write_text(
        "u1 one 0.10 0.50 two 0.80 1.20 three 1.50 2.00\n" "u2 five 0.20 0.60\n"
    )
    ctm = tmp_path / "ctm"
    ctm.write_text(
        ";; a comment line (the plug-in's CTM header): skipped\n"
        "u1 1 0.30 0.04 one 0.9\n"  # start error 0.20, delay -0.20
        "u1 1 0.60 0.04 nine 0.5\n"  # inserted: not counted
        "u1 1 1.40 0.04 two 0.9\n"  # start error 0.60, delay +0.20
        "u1 1 2.20 0.04 four 0.9\n"  # substitutes three: not counted
        "u2 1 0.56 0.04 five 0.8\n"  # start error 0.36, delay -0.04
    )
    assert st.main(str(ref), str(ctm), str(tmp_path / "out")) == 0
    got = json.loads((tmp_path / "out" / "times.json").read_text())
    assert got["reference_words"] == 4 and got["hypothesis_words"] == 5
    assert got["matched_words"] == 3
    assert got["start_error_median"] == pytest.approx(0.36)
    # linear interpolation: 0.36 + 0.8 * (0.60 - 0.36)
    assert got["start_error_p90"] == pytest.approx(0.552)
    assert got["delay_median"] == pytest.approx(-0.04)
    assert got["delay_mean"] == pytest.approx((-0.2 + 0.2 - 0.04) / 3)


def test_batched_beam_section_goals():
    """Ratios to batched greedy and to the one-at-a-time beam, WER differences and
    the multi-blank / TDT vs standard lines, from hand-made decoding results."""
    batched = import_local("report.batched")

    def entry(wer, secs, search=1.0):
        return ({"wer": wer}, {"decode_seconds": secs, "search_seconds": search})

    res = {
        ("standard", "beam", "test"): entry(7.0, 20.0),
        ("standard", "mb_beam_b32", "test"): entry(7.05, 3.0),
        ("multiblank", "mb_beam", "test"): entry(6.0, 15.0),
        ("multiblank", "mb_beam_b32", "test"): entry(6.0, 2.5),
        ("multiblank", "mb_beam_step_b32", "test"): entry(6.3, 1.5),
    }
    jobs = [(m, t) for m, t, _ in res]
    greedy = [
        ((m, "mb_greedy", "32", "plugin"), {"wer": 8.0}, {"decode_seconds": 2.0})
        for m in ("standard", "multiblank")
    ]
    text = "\n".join(batched.section(res, jobs, greedy, "test"))
    assert (
        "| multiblank | mb_beam_b32 | 6.00% | 6.00% | 2.50 s | 1.25x | 6.00x |" in text
    )
    assert "| standard | mb_beam_b32 | 7.05% | 7.00% | 3.00 s | 1.50x | 6.67x |" in text
    # 1.5x is within the goal, 0.75x too; 10x of the step rule, 6x, 6.67x
    assert "batched greedy decode time: yes (3 of 3" in text
    assert "one-at-a-time beam search: yes (3 of 3" in text
    # the step rule's WER is 0.30 above the multi-blank reference
    assert (
        "within 0.1 absolute (the standard model's reference is ESPnet's beam "
        "search, another algorithm): **no** (2 of 3" in text
    )
    assert (
        "multiblank mb_beam faster than standard mb_beam (batched, frame rule): "
        "yes (2.50 s vs 3.00 s)" in text
    )


def test_seed_spread_section(tmp_path):
    """WER per model and seed, the mean and max - min per model, and each model's
    difference to the standard model per seed with its mean and range, from
    hand-written score files."""
    import json

    seeds = import_local("report.seeds")
    wers = {  # (model, seed) -> WER %
        ("standard", 0): 7.0,
        ("standard", 1): 8.0,
        ("multiblank", 0): 7.5,
        ("multiblank", 1): 7.5,
        ("tdt", 0): 6.0,
        ("tdt", 1): 7.0,
    }
    specs = []
    for (model, seed), wer in wers.items():
        out = tmp_path / f"{model}{seed}"
        out.mkdir()
        (out / "score.json").write_text(json.dumps({"wer": wer}))
        search = {"standard": "greedy", "multiblank": "mb_greedy"}.get(model, "tdt_g")
        specs.append(f"{model}={search}={seed}={out}")
    lines = seeds.section(seeds.read_runs(specs), "test")
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0] == (
        "| seed | standard / greedy | multiblank / mb_greedy | tdt / tdt_g | "
        "multiblank - standard | tdt - standard |"
    )
    assert "| 0 | 7.00% | 7.50% | 6.00% | +0.50 | -1.00 |" in rows
    assert "| 1 | 8.00% | 7.50% | 7.00% | -0.50 | -1.00 |" in rows
    assert "| mean | 7.50% | 7.50% | 6.50% | +0.00 | -1.00 |" in rows
    assert rows[-1] == (
        "| spread (max - min) | 1.00 | 0.00 | 1.00 | -0.50 .. +0.50 | -1.00 .. -1.00 |"
    )


def _emission_delay():
    spec = importlib.util.spec_from_file_location(
        "emission_delay", LOCAL / "emission_delay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_emission_delay_matches_a_minimum_cost_alignment():
    """The matched word pairs are those of one minimum-cost alignment, found by
    enumerating every alignment of small cases."""
    import itertools
    import random

    delay = _emission_delay()

    def alignments(ref, hyp, i=0, j=0):
        """(cost, matched pairs) of every alignment."""
        if i == len(ref) and j == len(hyp):
            yield 0, []
            return
        if i < len(ref) and j < len(hyp):
            same = ref[i] == hyp[j]
            for cost, pairs in alignments(ref, hyp, i + 1, j + 1):
                yield cost + (not same), ([(i, j)] if same else []) + pairs
        if i < len(ref):
            for cost, pairs in alignments(ref, hyp, i + 1, j):
                yield cost + 1, pairs
        if j < len(hyp):
            for cost, pairs in alignments(ref, hyp, i, j + 1):
                yield cost + 1, pairs

    rng = random.Random(0)
    for _ in range(200):
        ref = [rng.choice("ab") for _ in range(rng.randint(0, 4))]
        hyp = [rng.choice("abc") for _ in range(rng.randint(0, 4))]
        every = list(alignments(ref, hyp))
        best = min(cost for cost, _ in every)
        got = delay.matches(ref, hyp)
        assert any(cost == best and pairs == got for cost, pairs in every)
    assert list(itertools.islice(delay.matches("abc", "abc"), 3)) == [
        (0, 0),
        (1, 1),
        (2, 2),
    ]


def test_emission_delay_file(tmp_path):
    """Delays of the matched words only, from hand-made files."""
    import json

    delay = _emission_delay()
    (tmp_path / "text").write_text("u1 one two three\nu2 five\n")
    # word_times (make_real_digits.py): <utt> <word> <start> <end> ...
    (tmp_path / "times").write_text(
        "u1 one 0.1 0.5 two 0.7 1.0 three 1.2 1.6\nu2 five 0.2 0.6\n"
    )
    best = tmp_path / "dec" / "1best_recog"
    best.mkdir(parents=True)
    (best / "text").write_text("u1 one four three\nu2 five zero\n")
    (best / "emission").write_text("u1 0.62 1.1 1.9\nu2 0.9 1.0\n")
    (best / "decided").write_text("u1 0.9 1.3 2.1\nu2 1.2 1.2\n")
    delay.main(str(tmp_path / "text"), str(tmp_path / "times"), str(tmp_path / "dec"))
    result = json.loads((tmp_path / "dec" / "emission_delay.json").read_text())
    # one (0.12), three (0.3), five (0.3); "four" and "zero" are errors
    assert result["matched_words"] == 3
    assert result["emission"]["mean"] == pytest.approx((0.12 + 0.3 + 0.3) / 3)
    assert result["decided"]["median"] == pytest.approx(0.5)
    (tmp_path / "times").write_text("u1 one 0.1 0.5 two 0.7\n")
    with pytest.raises(ValueError, match="triples"):
        delay.main(
            str(tmp_path / "text"), str(tmp_path / "times"), str(tmp_path / "dec")
        )


def test_streaming_section(tmp_path):
    """WER at a chunk against full context, same-hypothesis counts, latency, the goal
    lines and the batched table, from hand-made decoding outputs."""
    import json

    streaming = import_local("report.streaming")
    jobs = [("standard", "mb_greedy"), ("multiblank", "mb_greedy")]
    im = "valid.loss.ave"

    def write(d, wer=None, stats=None, text=None):
        d = Path(d)
        (d / "1best_recog").mkdir(parents=True)
        if wer is not None:
            (d / "score.json").write_text(json.dumps({"wer": wer}))
        if stats is not None:
            (d / "decoding_stats.json").write_text(json.dumps(stats))
        (d / "1best_recog" / "text").write_text(text or "")

    def stats(search, rtf=0.05):
        return {
            "rtf": rtf,
            "search_seconds": search,
            "chunk_seconds": 0.16,
            "encoder_lookahead_seconds": 0.046,
            "total_frames": 100,
            "frames_skipped": 40,
        }

    for m, wer in (("standard", 9.0), ("multiblank", 8.5)):
        write(
            streaming.chunk_dir(str(tmp_path), m, "mb_greedy", 4, im, "test"),
            wer=wer,
            text="u1 one two\nu2 three\nu3 four\n",
        )
    write(
        streaming.stream_dir(str(tmp_path), "standard", "mb_greedy", 4, 1, im, "test"),
        stats=stats(8.0),
        text="u1 one two\nu3 four\n",
    )
    write(
        streaming.stream_dir(
            str(tmp_path), "multiblank", "mb_greedy", 4, 1, im, "test"
        ),
        stats=stats(2.0),
        text="u1 one\nu3 four\n",
    )
    write(
        streaming.stream_dir(str(tmp_path), "standard", "mb_greedy", 4, 16, im, "test"),
        stats=stats(4.0, rtf=0.01),
        text="u1 one two\nu3 five\n",
    )
    res = streaming.load(str(tmp_path), jobs, [4], 16, 4, im, "test")
    offline = {
        ("standard", "mb_greedy", "test"): ({"wer": 8.0}, {}),
        ("multiblank", "mb_greedy", "test"): ({"wer": 8.0}, {}),
    }
    lines = streaming.section(res, offline, jobs, [4], 16, 4, "test", 2)
    row = [r for r in lines if r.startswith("| multiblank | mb_greedy | 160 ms")]
    assert row and "| 206 ms | 8.00% | 8.50% | 1 / 2 | 0.0500 | 2.00 s | 40.0% |" in (
        row[0]
    )
    std = [r for r in lines if r.startswith("| standard | mb_greedy | 160 ms")]
    assert std and "| 2 / 2 |" in std[0]
    assert any("standard, chunk 4: WER +1.00" in r and ": yes)" in r for r in lines)
    assert any("**4.00x** (goal >= 1.8x: yes)" in r for r in lines)
    batched = [r for r in lines if r.startswith("| standard | mb_greedy | 16 |")]
    assert batched and "| 0.0100 | 5.00x | 4.00 s | 1 / 2 |" in batched[0]


def test_header_names_the_cpu_and_its_vector_extension(tmp_path):
    """Times in the report depend on the CPU: its model and AVX-512 / AVX2 are named."""
    report = import_local("make_report")
    info = tmp_path / "cpuinfo"
    for flags, isa in (("fpu avx2 avx512f sse", "AVX-512"), ("fpu avx2", "AVX2")):
        info.write_text(
            f"processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: {flags}\n"
        )
        assert report.cpu_description(str(info)) == f"Some CPU 9000 ({isa})"
    info.write_text("processor\t: 0\nflags\t\t: sse2\n")
    assert report.cpu_description(str(info)) == "CPU (no AVX2)"
    missing = report.cpu_description(str(tmp_path / "none"))
    assert isinstance(missing, str) and missing
