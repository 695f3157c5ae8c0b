"""register(), the .pth start-up hook and registration in spawned workers."""

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from espnet_cases import TOKENS, tiny_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet import _hook, autoregister, registration


def _choices():
    from espnet2.tasks import asr

    return {k: getattr(asr, f"{k}_choices").classes for k in registration.ENTRIES}


def test_register_is_idempotent():
    espnet_multiblank.register()
    before = {k: dict(v) for k, v in _choices().items()}
    espnet_multiblank.register()
    registration.register()
    assert _choices() == before
    assert registration.is_registered()
    from espnet2.tasks.asr import ASRTask, model_choices

    from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel

    assert model_choices.classes["multiblank_espnet"] is MultiblankESPnetASRModel
    assert before["frontend"]["grad_scaled"].__name__ == "GradScaledFrontend"
    assert before["preencoder"]["grad_scaled"].__name__ == "GradScaledPreEncoder"
    # the same ClassChoices objects are the ones ASRTask builds its parser from
    assert any(c is model_choices for c in ASRTask.class_choices_list)
    parser = ASRTask.get_parser()
    args = parser.parse_args(
        ["--model", "multiblank_espnet", "--frontend", "grad_scaled"]
    )
    assert (args.model, args.frontend) == ("multiblank_espnet", "grad_scaled")


def test_register_refuses_a_taken_name(monkeypatch):
    from espnet2.tasks.asr import ESPnetASRModel, model_choices

    monkeypatch.setitem(model_choices.classes, "multiblank_espnet", ESPnetASRModel)
    with pytest.raises(RuntimeError, match="already taken"):
        registration.register()


def test_pth_file_is_one_import_line(tmp_path, monkeypatch):
    path = autoregister.write(str(tmp_path))
    text = open(path).read()
    assert text.startswith("import ") and text.count("\n") == 1
    assert autoregister.main(["status", "--dir", str(tmp_path)]) == 0
    # what site.py does with it: one finder in front, nothing imported
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(_hook.ENV_DISABLE, raising=False)
    modules = set(sys.modules)
    exec(text)
    exec(text)
    assert set(sys.modules) == modules
    finders = [
        f for f in sys.meta_path if getattr(f, "tag", None) == "espnet_multiblank"
    ]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]
    assert autoregister.remove(str(tmp_path)) and not autoregister.remove(str(tmp_path))


@pytest.fixture
def fake_target(monkeypatch, tmp_path):
    """A throw-away module to watch instead of espnet2.tasks.asr; records the calls
    the hook would make to register()."""
    (tmp_path / "mb_fake_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    _hook.uninstall()  # a finder of this process may still watch asr_inference
    monkeypatch.setattr(_hook, "INFERENCE_TARGET", "mb_fake_inference")
    monkeypatch.delitem(sys.modules, "mb_fake_target", raising=False)
    monkeypatch.delenv(_hook.ENV_DISABLE, raising=False)
    calls = []
    monkeypatch.setattr(
        _hook, "register_now", lambda: calls.append(sys.modules["mb_fake_target"].VALUE)
    )
    return calls


def _plugin_finders():
    return [f for f in sys.meta_path if getattr(f, "tag", None) == "espnet_multiblank"]


@pytest.mark.parametrize("how", ["pth", "in_process"])
def test_hook_fires_once_after_the_target_import(fake_target, monkeypatch, how):
    calls = fake_target
    if how == "pth":
        exec(autoregister.pth_line("mb_fake_target"))
    else:
        monkeypatch.setattr(_hook, "TARGET", "mb_fake_target")
        assert _hook.install_hook() and _hook.install_hook()
    assert len(_plugin_finders()) == 1
    import json  # noqa: F401  other imports are untouched

    assert calls == []
    import mb_fake_target

    assert mb_fake_target.VALUE == 1 and calls == [1]  # after the module executed
    # only the modules not executed yet are still watched
    watched = [f.targets for f in _plugin_finders()]
    assert watched == ([] if how == "pth" else [("mb_fake_inference",)])


def test_hook_disabled_by_environment(fake_target, monkeypatch):
    monkeypatch.setenv(_hook.ENV_DISABLE, "1")
    exec(autoregister.pth_line("mb_fake_target"))
    monkeypatch.setattr(_hook, "TARGET", "mb_fake_target")
    assert _hook.install_hook() is False
    assert _plugin_finders() == []
    import mb_fake_target  # noqa: F401

    assert fake_target == []


def test_install_hook_registers_at_once_when_target_already_imported(
    fake_target, monkeypatch
):
    import mb_fake_target  # noqa: F401

    monkeypatch.setattr(_hook, "TARGET", "mb_fake_target")
    assert _hook.install_hook() and fake_target == [1]


def test_spawned_worker_sees_registration(tmp_path, monkeypatch):
    """ESPnet's multi-GPU mode starts workers with the spawn method and target
    ``ASRTask.main_worker``; a worker only has what importing ``__main__`` and the
    target gives it. With ``python -m espnet_multiblank.bin.asr_train`` as main, a
    spawned process builds a multiblank model from the parent's parsed args.
    (Real multi-process training, CPU spawn path and torchrun included, is tested in
    test_espnet_ddp.py.)"""
    from espnet2.tasks.asr import ASRTask

    from espnet_multiblank.bin import asr_train

    (tmp_path / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config()))
    args = ASRTask.get_parser().parse_args(
        [
            "--config",
            str(tmp_path / "c.yaml"),
            "--token_list",
            str(tmp_path / "tokens.txt"),
        ]
    )
    monkeypatch.setitem(sys.modules, "__main__", asr_train)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=ASRTask.build_model, args=(args,))
    proc.start()
    proc.join(timeout=300)
    assert proc.exitcode == 0


QUIET = textwrap.dedent("""
    import importlib.util
    import sys
    import nltk
    own = nltk.download
    import espnet_multiblank.espnet.registration.quiet  # g2p_en, downloads off
    # ESPnet 202511 installs g2p_en; 202611 only with its "tts" extra
    assert "g2p_en" in sys.modules or importlib.util.find_spec("g2p_en") is None
    assert nltk.download is own, "nltk.download not restored"
    import espnet2.tasks.asr  # noqa: F401
    print("ok")
    """)


def test_quiet_import_without_nltk_data(tmp_path):
    """With no nltk data installed (an empty NLTK_DATA), ESPnet's import through the
    plug-in prints no nltk download error (and tries no download), and nltk.download
    is nltk's own afterwards."""
    env = dict(os.environ, NLTK_DATA=str(tmp_path), PYTHONWARNINGS="ignore")
    env[_hook.ENV_DISABLE] = "1"
    out = subprocess.run(
        [sys.executable, "-c", QUIET],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"
    assert "nltk_data" not in out.stderr and "nltk_data" not in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_stock_entry_point_prints_no_nltk_errors(tmp_path):
    """ESPnet's stock ``python -m espnet2.bin.asr_inference`` with the start-up hook,
    no nltk data and no network: no nltk_data download errors (the hook imports
    g2p_en with downloads off before ESPnet does)."""
    from hook_env import stock_env

    nltk_data = tmp_path / "nltk_data"
    nltk_data.mkdir()
    env = dict(stock_env(tmp_path), NLTK_DATA=str(nltk_data), PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, "-m", "espnet2.bin.asr_inference", "--help"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--allow_failed_utterances" in out.stdout  # the hook wrapped the parser
    assert "nltk_data" not in out.stderr and "nltk_data" not in out.stdout
    assert list(nltk_data.iterdir()) == []
