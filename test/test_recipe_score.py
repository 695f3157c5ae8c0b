"""The recipe's scorer (egs/digits/asr1/local/score.py) vs brute-force alignment."""

import importlib.util
import itertools
import json
import random
from pathlib import Path

import pytest

SCORE = Path(__file__).resolve().parents[1] / "egs/digits/asr1/local/score.py"


@pytest.fixture(scope="module")
def scorer():
    spec = importlib.util.spec_from_file_location("recipe_score", SCORE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alignments(ref, hyp):
    """Every alignment of ref and hyp as a list of operations m/s/d/i."""
    if not ref and not hyp:
        yield []
        return
    if ref and hyp:
        op = "m" if ref[0] == hyp[0] else "s"
        for rest in alignments(ref[1:], hyp[1:]):
            yield [op] + rest
    if ref:
        for rest in alignments(ref[1:], hyp):
            yield ["d"] + rest
    if hyp:
        for rest in alignments(ref, hyp[1:]):
            yield ["i"] + rest


def cases():
    rng = random.Random(0)
    out = [([], []), (["a"], []), ([], ["a", "b"]), (list("abc"), list("abcc"))]
    for _ in range(150):
        out.append(
            (
                [rng.choice("abc") for _ in range(rng.randint(0, 5))],
                [rng.choice("abc") for _ in range(rng.randint(0, 5))],
            )
        )
    return out


def test_align_and_end_insertions_match_brute_force(scorer):
    for ref, hyp in cases():
        all_ops = list(alignments(ref, hyp))
        cost = lambda ops: sum(op != "m" for op in ops)  # noqa: E731
        best = min(cost(ops) for ops in all_ops)
        optimal = [ops for ops in all_ops if cost(ops) == best]
        s, d, n = scorer.align(ref, hyp)
        assert (s, d, n) in {
            (ops.count("s"), ops.count("d"), ops.count("i")) for ops in optimal
        }, (ref, hyp)
        trailing = [
            len(ops) - len(list(itertools.dropwhile(lambda o: o == "i", ops[::-1])))
            for ops in optimal
        ]
        assert scorer.end_insertions(ref, hyp) == max(trailing), (ref, hyp)


def test_score_files(scorer, tmp_path):
    (tmp_path / "ref").write_text("u1 one two three\nu2 four five\nu3 six\n")
    (tmp_path / "hyp").write_text("u1 one two three three\nu2 five\n")
    scorer.main(str(tmp_path / "ref"), str(tmp_path / "hyp"), str(tmp_path / "out"))
    res = json.loads((tmp_path / "out" / "score.json").read_text())
    # u1: one insertion at the end; u2: one deletion; u3: missing, one deletion
    assert (res["insertions"], res["deletions"], res["substitutions"]) == (1, 2, 0)
    assert res["end_insertions"] == 1 and res["missing_hypotheses"] == 1
    assert res["wer"] == pytest.approx(100 * 3 / 6)
    chars = len("one two three") + len("four five") + len("six")
    assert res["cer"] == pytest.approx(100 * (6 + 5 + 3) / chars)
