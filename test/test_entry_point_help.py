"""The entry points' ``--help`` and what they print.

* ``python -m espnet_multiblank.bin.asr_inference --help``: every option has a help
  text with its default; ``--transducer_conf``'s keys and every search type's
  defaults are listed (the oracle: docs/decoding.md's table); ``--token_type word``
  is accepted and decodes (tokens joined by spaces); ESPnet's parser built from its
  source equals the imported one (every action: names, defaults, choices, help,
  types) under the installed ESPnet; ``--help`` imports none of ESPnet's models.
* ``python -m espnet_multiblank.bin.stream_wav --help`` and ``asr_train --help``:
  every option explained, with its default.
* Quiet: no ``Failed to import Flash Attention`` line on stdout and no
  ``torch.cuda.amp.autocast`` FutureWarning on stderr from the plug-in's entry point
  (a whole decoding run), nor from ESPnet's stock ``--help`` with the start-up hook;
  the stdout filter drops that line only.
"""

import io
import re
import subprocess
import sys

import pytest
from espnet_experiments import inference_args
from hook_env import stock_env
from test_decoding_cli import REPO, make_data, run_inference  # noqa: I100
from test_decoding_stock import plugin_experiments, read_outputs
from test_search_defaults import docs_table

from espnet_multiblank.bin import asr_inference, stream_wav
from espnet_multiblank.espnet.inference.arguments import get_parser_from_source
from espnet_multiblank.espnet.registration.quiet import (
    FLASH_ATTENTION_LINE,
    LineFilter,
)
from espnet_multiblank.search_defaults import TRANSDUCER_CONF_KEYS

pytestmark = pytest.mark.timeout(1200)


def help_entries(text: str):
    """{option: its help text} of an argparse help (options and their texts)."""
    entries, current = {}, None
    for line in text.splitlines():
        match = re.match(r"  (--?\w[\w-]*)", line)
        if match:
            current = match.group(1)
            entries[current] = line[len(match.group(0)) :]
        elif current is not None and line.startswith("      "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


@pytest.mark.parametrize("module", [asr_inference, stream_wav, "asr_train"])
def test_every_option_is_explained_with_its_default(module):
    if module == "asr_train":  # registers the plug-in at import
        from espnet_multiblank.bin import asr_train as module
    parser = module.get_parser()
    entries = help_entries(parser.format_help())
    for action in parser._actions:
        if action.dest == "help":
            continue
        option = next(o for o in action.option_strings if o.startswith("--"))
        assert action.help and action.help.strip(), option  # says what it is
        text = entries.get(option, "")
        assert "(default: " in text, (option, text)


def test_transducer_conf_keys_and_search_defaults_are_listed():
    text = asr_inference.get_parser().format_help()
    epilog = text.split("--transducer_conf keys", 1)[1]
    for key in TRANSDUCER_CONF_KEYS:
        assert re.search(rf"^  {key} ", epilog, re.M), key
    for search_type, settings in docs_table().items():
        line = re.search(rf"^  {search_type} +(.*(?:\n {{8,}}.*)*)", epilog, re.M)
        assert line, search_type
        got = dict(kv.split("=") for kv in line.group(1).split())
        want = {k: str(v).lower() for k, v in settings.items()}
        assert got == want, search_type


def test_the_parser_built_from_source_is_espnets():
    from espnet2.bin import asr_inference as espnet

    espnet_get_parser = getattr(espnet.get_parser, "espnet_get_parser", None)
    real = (espnet_get_parser or espnet.get_parser)()
    from_source = get_parser_from_source()
    assert from_source is not None  # the quick route works with this ESPnet
    built = from_source()

    def kind(t):  # get_parser's own lambdas are new objects each time
        code = getattr(t, "__code__", None)
        if code is not None and t.__name__ == "<lambda>":
            return (code.co_code, code.co_consts, code.co_names)
        return t

    def describe(parser):
        return [
            (
                tuple(a.option_strings),
                a.dest,
                repr(a.default),
                a.choices,
                a.help,
                a.required,
                a.nargs,
                kind(a.type),
                type(a).__name__,
            )
            for a in parser._actions
        ], [g.title for g in parser._action_groups]

    assert describe(built) == describe(real)


def test_the_loop_is_still_importable_from_the_entry_point():
    """What the recipe's decode_many.py and the tests import from it (lazily)."""
    from espnet_multiblank.bin.asr_inference import exit_status, inference
    from espnet_multiblank.espnet.inference import loop

    assert (exit_status, inference) == (loop.exit_status, loop.inference)
    with pytest.raises(AttributeError):
        asr_inference.no_such_name


def test_help_loads_no_model_code():
    code = (
        "import sys\n"
        "from espnet_multiblank.bin import asr_inference\n"
        "asr_inference.get_parser().format_help()\n"
        "print(sorted(m for m in ('espnet2.bin.asr_inference', 'espnet2.tasks.asr',"
        " 'espnet2.asr.espnet_model') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_word_token_type_is_accepted_and_decodes(tmp_path):
    import espnet_multiblank

    espnet_multiblank.register()
    scp = make_data(tmp_path)
    exp = plugin_experiments(tmp_path, (("mb", (2, 4), 0.5, 10.0),))["mb"]
    out = tmp_path / "word"
    run_inference(exp, scp, out, "mb_greedy.yaml", "--token_type", "word")
    outputs = read_outputs(out)
    assert any(outputs["token"].values())
    for key, tokens in outputs["token"].items():  # word: tokens joined by spaces
        assert outputs["text"].get(key, "") == tokens, key


def test_the_stdout_filter_drops_that_line_only():
    target = io.StringIO()
    quiet = LineFilter(target, FLASH_ATTENTION_LINE)
    for piece in (
        "Fail",  # could become the line: held
        "ed to import Flash Attention, using ESPnet default: no flash_attn",
        "\nFailing test: kept\nresult 1",
        " 2\n",
        "Fa",
    ):
        quiet.write(piece)
    quiet.finish()
    assert target.getvalue() == "Failing test: kept\nresult 1 2\nFa"


def _quiet(proc: subprocess.CompletedProcess):
    assert FLASH_ATTENTION_LINE not in proc.stdout
    assert "torch.cuda.amp.autocast" not in proc.stderr, proc.stderr[-3000:]


def test_entry_points_print_no_notes_about_optional_packages(tmp_path):
    """A whole decoding run of the plug-in's entry point, and ESPnet's stock
    ``--help`` with the start-up hook, in fresh processes."""
    import espnet_multiblank

    espnet_multiblank.register()
    scp = make_data(tmp_path)
    exp = plugin_experiments(tmp_path, (("mb", (2, 4), 0.5, 10.0),))["mb"]
    env = stock_env(tmp_path)
    decode = [
        sys.executable,
        "-m",
        "espnet_multiblank.bin.asr_inference",
        *inference_args(
            exp,
            scp,
            tmp_path / "out",
            "--config",
            str(REPO / "conf" / "decode" / "mb_greedy.yaml"),
        ),
    ]
    proc = subprocess.run(
        decode, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""  # a decoding writes files, not stdout
    _quiet(proc)
    assert (tmp_path / "out" / "1best_recog" / "text").exists()
    stock = [sys.executable, "-m", "espnet2.bin.asr_inference", "--help"]
    proc = subprocess.run(
        stock, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage:")
    _quiet(proc)
