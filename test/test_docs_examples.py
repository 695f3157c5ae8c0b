"""Every code example of README.md and docs/ runs: the fenced blocks.

* ````python`` blocks run file by file, in order, each file's blocks in one namespace
  (a tutorial's later blocks use what its earlier ones made), from a directory laid
  out as the repository's root after the digits recipe (:func:`recipe_root`):
  ``conf/decode`` (the repository's), ``egs/digits/asr1/exp/asr_multiblank`` (a random
  multi-blank ``chunk_conformer`` model at 8 kHz, the recipe's kind, built here),
  ``egs/digits/asr1/exp/lm_train`` (a random LSTM LM over its tokens),
  ``egs/digits/asr1/data/test/wav.scp`` and its wavs. Blocks that show what to do in
  one's own model code get the tensors they name (:data:`GIVEN`, from a tiny
  multi-blank model: ``model``, ``enc_out``, ``joint_out`` ...).
* ````bash`` blocks: every command is ``python -m espnet_multiblank.bin.<entry point>
  ...``, run in this process (its ``main``) from that directory, and must succeed
  (``name=value`` lines set the variables the commands use); anything else in a
  fenced bash block fails the test.
* ````yaml`` blocks parse; the example training config equals the file it presents,
  and the fragments build a model once put into a tiny config.

Other blocks (indented ones: set-up commands, output layouts) are not examples.
"""

import importlib
import re
import shlex
from pathlib import Path

import pytest
import soundfile
import torch
import yaml
from espnet_cases import build, tiny_config  # noqa: I100
from espnet_experiments import dry_run_experiment
from streaming_cases import TOKENS, make_experiment, waveform

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md"] + sorted(
    str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")
)
RECIPE = Path("egs/digits/asr1")
#: the names the "your own model code" blocks use (from :func:`given`)
GIVEN = {
    "model",
    "enc_out",
    "enc_lens",
    "T",
    "encoder_out",
    "encoder_out_lens",
    "labels",
    "decoder",
    "joint_network",
    "joint",
    "dec_out",
    "label_lens",
    "blank_id",
    "joint_out",
    "ys",
    "ys_lens",
    "frontend_out",
    "feats",
    "logits",
}


def fenced_blocks(path: Path):
    """``(language, first line number, code)`` of every fenced block."""
    out, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, lines = line[3:].strip(), number + 1, []
            else:
                out.append((lang, start, "\n".join(lines) + "\n"))
                lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path}: a fenced block is not closed"
    return out


def docs_with(lang: str):
    """The documents that have fenced blocks of ``lang``."""
    return [d for d in DOCS if any(b[0] == lang for b in fenced_blocks(REPO / d))]


def test_the_blocks_are_found():
    kinds = {}
    for doc in DOCS:
        for lang, _, _ in fenced_blocks(REPO / doc):
            kinds[lang] = kinds.get(lang, 0) + 1
    # every language of a fenced block is one this test runs
    assert set(kinds) == {"python", "bash", "yaml"}, kinds
    assert kinds["python"] >= 12 and kinds["bash"] >= 3 and kinds["yaml"] >= 5


@pytest.fixture(scope="module")
def recipe_root(tmp_path_factory):
    """The repository root as the docs see it after the digits recipe."""
    import espnet_multiblank

    espnet_multiblank.register()
    root = tmp_path_factory.mktemp("docs_root")
    (root / "conf").mkdir()
    (root / "conf" / "decode").symlink_to(REPO / "conf" / "decode")
    exp = root / RECIPE / "exp"
    asr = make_experiment(exp / "asr_multiblank", "multiblank", blank_bias=1.5)
    (asr / "model.pth").rename(asr / "valid.loss.ave.pth")
    from espnet2.tasks.lm import LMTask

    lm = dry_run_experiment(
        exp / "lm_train",
        ["--token_type", "char", "--lm", "seq_rnn", "--lm_conf", "{unit: 16}"],
        task=LMTask,
        tokens=TOKENS,
    )
    (lm / "model.pth").rename(lm / "valid.loss.best.pth")
    wavs = root / RECIPE / "wav" / "test" / "wav"
    wavs.mkdir(parents=True)
    lines = []
    for i, n in enumerate((9000, 6000, 12000, 7500)):
        key = f"espeak-en-029-klatt2_test0000{51 + i}"
        soundfile.write(wavs / f"{key}.wav", waveform(n, i), 8000, subtype="FLOAT")
        lines.append(f"{key} {(wavs / f'{key}.wav').relative_to(root)}")
    data = root / RECIPE / "data" / "test"
    data.mkdir(parents=True)
    (data / "wav.scp").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def given(tmp_path_factory):
    """What the "your own model code" blocks take as given, from a tiny multi-blank
    model (blank 3, big blanks [2, 4, 8]) and three short utterances."""
    from espnet2.asr_transducer.utils import get_transducer_task_io
    from espnet_cases import batch

    model = build(tmp_path_factory.mktemp("given"), tiny_config())
    model.eval()
    speech, speech_lengths, text, _ = batch(model.token_list)
    with torch.no_grad():
        enc_out, enc_lens = model.encode(speech, speech_lengths)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text, enc_lens, ignore_id=-1, blank_id=model.blank_id
    )
    model.decoder.blank_id = model.blank_id
    with torch.no_grad():
        dec_out = model.decoder(decoder_in)
    joint_out = model.joint_network(
        enc_out.unsqueeze(2), dec_out.unsqueeze(1)
    ).requires_grad_()
    frontend_out = torch.randn(3, 20, 8, requires_grad=True)
    values = dict(
        model=model,
        enc_out=enc_out,
        enc_lens=enc_lens,
        T=int(enc_lens[0]),
        encoder_out=enc_out,
        encoder_out_lens=enc_lens,
        labels=text,
        decoder=model.decoder,
        joint_network=model.joint_network,
        joint=model.joint_network,
        dec_out=dec_out,
        label_lens=u_len,
        blank_id=model.blank_id,
        joint_out=joint_out,
        ys=target,
        ys_lens=u_len,
        frontend_out=frontend_out,
        feats=frontend_out,
        logits=joint_out,
    )
    assert set(values) == GIVEN and model.blank_id == 3
    return values


@pytest.mark.parametrize("doc", docs_with("python"))
def test_python_examples_run(doc, recipe_root, given, monkeypatch, capsys):
    blocks = [b for b in fenced_blocks(REPO / doc) if b[0] == "python"]
    monkeypatch.chdir(recipe_root)
    torch.set_num_threads(1)
    namespace = {"__name__": f"docs_{Path(doc).stem}", **given}
    for _, line, code in blocks:
        try:
            exec(compile(code, f"{doc}:{line}", "exec"), namespace)
        except Exception as e:  # name the block
            raise AssertionError(f"{doc}, the block at line {line}: {e!r}") from e


def test_the_quick_start_says_what_it_shows(recipe_root, given, monkeypatch, capsys):
    """docs/python.md's printed lines: a hypothesis, the three refused inputs with
    their reasons, one line per batched input, a line per word, per piece."""
    monkeypatch.chdir(recipe_root)
    namespace = dict(given)
    for _, line, code in fenced_blocks(REPO / "docs" / "python.md"):
        exec(compile(code, f"python.md:{line}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "speech: sample rate 16000 Hz, the model's is 8000 Hz" in out
    assert "speech: too short: 10 samples" in out
    assert "speech: 2 channels, the model takes one" in out
    assert (
        sum(re.match(r"\S+test0000\d\d\.wav", x) is not None for x in out.splitlines())
        == 4
    )
    assert namespace["token_ids"], "the random model emits labels"
    words = namespace["s2t"].word_times(namespace["nbest"][0])
    assert words and all(w.end > w.start for w in words)
    assert re.search(r"^\d\.\d s: ", out, re.M)


def _commands(code: str):
    """The commands of a bash block: continuation lines joined, comments dropped,
    ``name=value`` lines as variables."""
    variables, commands = {}, []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and re.fullmatch(r"\w+=\S*", words[0]):
            name, value = words[0].split("=", 1)
            variables[name] = value
            continue
        commands.append(
            [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], w) for w in words]
        )
    return commands


@pytest.mark.parametrize("doc", docs_with("bash"))
def test_command_examples_run(doc, recipe_root, monkeypatch, capsys):
    blocks = [b for b in fenced_blocks(REPO / doc) if b[0] == "bash"]
    monkeypatch.chdir(recipe_root)
    torch.set_num_threads(1)
    for _, line, code in blocks:
        commands = _commands(code)
        assert commands, f"{doc}:{line}: a command block without a command"
        for words in commands:
            assert words[:2] == ["python", "-m"] and words[2].startswith(
                "espnet_multiblank.bin."
            ), f"{doc}:{line}: not an entry point of the plug-in: {words}"
            main = importlib.import_module(words[2]).main
            try:
                status = main(words[3:])
            except SystemExit as e:  # the entry points' sys.exit(status)
                status = e.code
            assert status in (0, None), f"{doc}:{line}: exit status {status}"
            if "--output_dir" in words:  # it decoded every utterance
                out_dir = Path(words[words.index("--output_dir") + 1])
                text = (out_dir / "1best_recog" / "text").read_text().splitlines()
                assert len(text) == 4, f"{doc}:{line}"
    out = capsys.readouterr().out
    if "stream_wav" in "".join(b[2] for b in blocks):
        assert "final:" in out and "emitted:" in out


def _merge(base: dict, fragment: dict) -> dict:
    out = dict(base)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("doc", docs_with("yaml"))
def test_yaml_examples_parse_and_build(doc, tmp_path):
    from streaming_cases import stats_file

    blocks = [b for b in fenced_blocks(REPO / doc) if b[0] == "yaml"]
    for i, (_, line, code) in enumerate(blocks):
        conf = yaml.safe_load(code)
        assert isinstance(conf, dict), f"{doc}:{line}"
        if "batch_type" in conf:  # a whole training config: the file it shows
            shipped = REPO / "conf" / "train_multiblank_conformer_transducer.yaml"
            full = yaml.safe_load(shipped.read_text())
            assert {k: full.get(k) for k in conf} == conf, f"{doc}:{line}"
            continue
        merged = _merge(tiny_config(), conf)
        if merged.get("normalize") == "global_mvn":  # its statistics: the recipe's
            n_mels = merged["frontend_conf"]["n_mels"]
            merged["normalize_conf"] = {"stats_file": str(stats_file(tmp_path, n_mels))}
        if "frontend" in conf:  # another frontend: the tiny one's conf is not its
            merged["frontend_conf"] = conf.get("frontend_conf", {})
        where = tmp_path / f"b{i}"
        where.mkdir()
        try:
            build(where, merged)
        except Exception as e:
            raise AssertionError(f"{doc}, the YAML at line {line}: {e!r}") from e
