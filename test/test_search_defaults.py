"""One table of search defaults for the decode YAMLs, the command line and Python.

For every shipped decode config (``conf/decode/*.yaml``) its search name (the
``transducer_conf`` it writes: a search type and its variant keys) gives the same
hypotheses (tokens and scores) by three routes, on a random model of the lattice
the config is for:

* the YAML: the plug-in's entry point with ``--config``;
* the command line: ``--transducer_conf`` with the same keys, no ``--config``, no
  ``--beam_size``;
* Python: ``MultiblankSpeech2Text(transducer_conf=<the same keys>)``, one utterance
  at a time.

The oracle for the settings is the table of docs/decoding.md ("Search defaults"),
written by hand: the search the Python route builds has them, the code's table
(``SEARCH_DEFAULTS``) says the same, and the YAML files spell out no key with another
value. ``mb_greedy``'s ``max_sym_per_frame`` is shown to matter on the multi-blank
model (10 decodes differently): the old Python default would fail here.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from espnet_experiments import inference_args
from test_decoding_cli import CONF, REPO, make_data  # noqa: I100
from test_decoding_stock import plugin_experiments, read_outputs
from test_tdt_cli import make_tdt_experiment

import espnet_multiblank
from espnet_multiblank import search_defaults
from espnet_multiblank.search_defaults import SEARCH_DEFAULTS

pytestmark = pytest.mark.timeout(1200)

#: the lattice each shipped config is for
MODEL_OF = {
    "mb_greedy": "mb",
    "mb_greedy_loop_labels": "mb",
    "mb_beam": "mb",
    "mb_beam_step": "mb",
    "mb_beam_label": "mb",
    "greedy": "std",
    "beam": "std",
    "tdt_greedy": "tdt",
    "tdt_beam": "tdt",
    "tdt_beam_step": "tdt",
    "tdt_beam_label": "tdt",
}
#: what a config may set besides the table's keys: a variant of its search type
VARIANT_KEYS = {"loop_labels", "beam_sync", "frame_prune"}


def docs_table() -> dict:
    """{search_type: {key: value}} of docs/decoding.md's "Search defaults" table
    (``-``: not set)."""
    text = (REPO / "docs" / "decoding.md").read_text()
    section = text.split("### Search defaults", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    header = next(line for line in section.splitlines() if line.startswith("| search"))
    keys = [k.strip(" `") for k in header.strip("|").split("|")][1:]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        values = {
            k: yaml.safe_load(v.strip("`")) for k, v in zip(keys, cells[1:]) if v != "-"
        }
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            table[name] = values
    return table


def test_the_old_path_gives_the_same_table():
    from espnet_multiblank.espnet.inference import search_defaults as old

    for name in (
        "DEFAULT_SEARCH_TYPE",
        "ESPNET_BEAM_SIZE",
        "SEARCH_DEFAULTS",
        "TRANSDUCER_CONF_KEYS",
        "defaults_help",
        "search_settings",
    ):
        assert getattr(old, name) is getattr(search_defaults, name)


def test_the_runtime_reads_the_table_without_the_espnet_layer():
    """The runtime's searches take their defaults from the bottom layer: importing
    them imports nothing of ``espnet_multiblank.espnet``."""
    code = (
        "import sys\n"
        "import espnet_multiblank.runtime.greedy\n"
        "import espnet_multiblank.runtime.recognizer\n"
        "print([m for m in sys.modules if m.startswith('espnet_multiblank.espnet')])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_code_and_the_docs_give_the_same_table():
    assert docs_table() == SEARCH_DEFAULTS


@pytest.mark.parametrize("name", sorted(MODEL_OF))
def test_shipped_configs_set_no_other_value(name):
    conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    tconf = dict(conf["transducer_conf"])
    table = SEARCH_DEFAULTS[tconf.pop("search_type")]
    for key, value in tconf.items():
        assert key in VARIANT_KEYS or table.get(key) == value, (name, key)
    if "beam_size" in conf:
        assert conf["beam_size"] == table["beam_size"], name


def test_every_shipped_config_is_tested():
    assert {p.stem for p in CONF.glob("*.yaml")} == set(MODEL_OF)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    scp = make_data(root)
    espnet_multiblank.register()
    exps = plugin_experiments(root, (("mb", (2, 4), 0.5, 10.0), ("std", (), 0.5, 10.0)))
    (root / "tdt").mkdir()
    exps["tdt"] = make_tdt_experiment(root / "tdt")
    return root, scp, exps


def _cli(exp: Path, scp: Path, out: Path, *extra: str) -> dict:
    from espnet_multiblank.bin.asr_inference import get_parser, inference

    args = get_parser().parse_args(inference_args(exp, scp, out, *extra))
    kwargs = vars(args)
    kwargs.pop("config", None)
    kwargs.pop("allow_failed_utterances", None)
    torch.set_num_threads(1)
    inference(**kwargs)
    outputs = read_outputs(out)
    return {
        key: (outputs["token_int"][key], float(outputs["score"][key]))
        for key in outputs["token_int"]
    }


def _python(exp: Path, scp: Path, transducer_conf: dict):
    import soundfile

    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    s2t = MultiblankSpeech2Text(
        asr_train_config=exp / "config.yaml",
        asr_model_file=exp / "model.pth",
        transducer_conf=transducer_conf,
        device="cpu",
    )
    got = {}
    for line in scp.read_text().splitlines():
        key, path = line.split()
        best = s2t(soundfile.read(path, dtype="float32"))[0]
        got[key] = (" ".join(map(str, best[2])), float(best[3].score))
    return got, s2t.beam_search_transducer


def _same(a: dict, b: dict, what: str):
    assert a.keys() == b.keys(), what
    for key in a:
        assert a[key][0] == b[key][0], (what, key)
        assert a[key][1] == pytest.approx(b[key][1], rel=1e-5, abs=1e-5), (what, key)


def _settings(search) -> dict:
    names = ("beam_size", "max_sym_per_frame", "blank_decision", "score_norm")
    out = {k: getattr(search, k) for k in names if hasattr(search, k)}
    if hasattr(search, "beam_sync"):
        out["beam_sync"] = search.beam_sync
    return out


@pytest.mark.parametrize("name", sorted(MODEL_OF))
def test_the_same_search_by_yaml_command_line_and_python(setup, name):
    root, scp, exps = setup
    exp = exps[MODEL_OF[name]]
    tconf = yaml.safe_load((CONF / f"{name}.yaml").read_text())["transducer_conf"]
    by_yaml = _cli(
        exp, scp, root / f"yaml_{name}", "--config", str(CONF / f"{name}.yaml")
    )
    # labels emitted (ESPnet's beam search on this random standard model finds
    # only empty hypotheses: there the scores tell the routes apart)
    assert name == "beam" or any(tokens for tokens, _ in by_yaml.values()), name
    flag = ",".join(f"{k}={str(v).lower()}" for k, v in tconf.items())
    by_flag = _cli(exp, scp, root / f"flag_{name}", "--transducer_conf", flag)
    by_python, search = _python(exp, scp, tconf)
    _same(by_flag, by_yaml, f"{name}: --transducer_conf vs --config")
    _same(by_python, by_yaml, f"{name}: Python vs --config")
    # the Python route's search has the documented settings (those a search of
    # this type has: ESPnet's greedy search has no max_sym_per_frame, ...)
    table = docs_table()[tconf["search_type"]]
    settings = _settings(search)
    expected = {**table, **{k: v for k, v in tconf.items() if k in settings}}
    for key, value in settings.items():
        if key in expected:
            assert value == expected[key], (name, key)
    if name.startswith("mb_") or name.startswith("tdt_"):
        assert set(settings) >= set(table) - {"score_norm"}, (name, settings)


def test_max_sym_per_frame_matters_here(setup):
    """The old Python default (10) decodes these utterances differently from
    mb_greedy.yaml's 1: the test above can tell the routes apart."""
    root, scp, exps = setup
    one, _ = _python(exps["mb"], scp, {"search_type": "mb_greedy"})
    ten, search = _python(
        exps["mb"], scp, {"search_type": "mb_greedy", "max_sym_per_frame": 10}
    )
    assert search.max_sym_per_frame == 10
    assert any(one[k][0] != ten[k][0] for k in one)
