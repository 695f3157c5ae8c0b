"""The layout of ``espnet_multiblank/espnet/``: one sub-package per job, imports in one
direction, and the paths that installed files and users' code name.

The order (``espnet_multiblank/espnet/__init__.py`` lists it): errors < frontends <
batch_exact < {model, encoders} < registration < {inference, training} < the start-up
hook (``_hook``, ``autoregister``). A module may import its own group and the groups
below it, never one above or beside it (inference and training are independent),
and never the command-line modules of ``espnet_multiblank.bin``; imports inside
functions count too.
"""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "espnet_multiblank", "espnet")
PREFIX = "espnet_multiblank.espnet"

#: group (sub-package, or module at the root) -> rank
RANKS = {
    "compat": 0,
    "errors": 0,
    "frontends": 1,
    "batch_exact": 2,
    "model": 3,
    "encoders": 3,
    "registration": 4,
    "inference": 5,
    "training": 5,
    "_hook": 6,
    "autoregister": 6,
}
SUBPACKAGES = sorted(g for g in RANKS if os.path.isdir(os.path.join(PACKAGE, g)))


def _modules():
    """(dotted name, path) of every module under espnet_multiblank/espnet/."""
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[: -len(".py")]
                dotted = "espnet_multiblank." + rel.replace(os.sep, ".")
                yield dotted.removesuffix(".__init__"), path


def _imported(module: str, path: str):
    """Absolute names of every module ``module`` imports, wherever in the file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            yield base
            for alias in node.names:  # "from pkg import submodule"
                yield f"{base}.{alias.name}"


def _group(name: str):
    if name != PREFIX and name.startswith(PREFIX + "."):
        return name[len(PREFIX) + 1 :].split(".")[0]
    return None


def _violations(modules):
    """One line per (module, group above or beside it that it imports)."""
    found = set()
    for module, path in modules:
        own = _group(module)
        for name in _imported(module, path):
            if name.split(".")[:2] == ["espnet_multiblank", "bin"]:
                found.add(f"{module} imports espnet_multiblank.bin (the entry points)")
                continue
            other = _group(name)
            if other is None or other == own or other not in RANKS:
                continue
            if RANKS[other] >= RANKS[own]:
                found.add(f"{module} ({own}) imports {other}")
    return sorted(found)


def test_every_module_belongs_to_a_ranked_group():
    groups = {_group(m) for m, _ in _modules() if m != PREFIX}
    assert groups == set(RANKS), groups ^ set(RANKS)
    root = sorted(
        n for n in os.listdir(PACKAGE) if n.endswith(".py") and n != "__init__.py"
    )
    assert root == ["_hook.py", "autoregister.py", "compat.py", "errors.py"], root


def test_imports_go_down_only():
    assert _violations(list(_modules())) == []


def _legacy_espnet_imports(module: str, path: str):
    """Names of ESPnet 1's code (``espnet.*`` up to 202511, ``espnet2.legacy.*``
    from 202611) that ``module`` imports directly."""
    for name in _imported(module, path):
        parts = name.split(".")
        if parts[0] == "espnet" or parts[:2] == ["espnet2", "legacy"]:
            yield name


def _python_files():
    """(dotted name, path) of every module of the package, its tests, benchmarks
    and recipe scripts."""
    for top in ("espnet_multiblank", "test", "bench", "egs"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, ROOT)[: -len(".py")]
                    yield rel.replace(os.sep, "."), path


def test_only_compat_imports_espnet_legacy_code():
    """ESPnet 202611 moved espnet.nets / espnet.utils to espnet2.legacy: every use
    goes through espnet_multiblank.espnet.compat, which finds either layout."""
    found = {
        module: sorted(set(_legacy_espnet_imports(module, path)))
        for module, path in _python_files()
        if module != f"{PREFIX}.compat"
    }
    assert {m: names for m, names in found.items() if names} == {}


def test_a_legacy_import_is_caught(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(
        "from espnet.nets.pytorch_backend.nets_utils import make_pad_mask\n"
        "def f():\n"
        "    import espnet2.legacy.utils.cli_utils\n"
        "    from espnet2 import __version__\n"
    )
    assert sorted(set(_legacy_espnet_imports("bad", str(path)))) == [
        "espnet.nets.pytorch_backend.nets_utils",
        "espnet.nets.pytorch_backend.nets_utils.make_pad_mask",
        "espnet2.legacy.utils.cli_utils",
    ]


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a model module importing inference, one importing bin."""
    path = tmp_path / "bad.py"
    path.write_text(
        "def f():\n"
        "    from espnet_multiblank.espnet.inference import search\n"
        "    import espnet_multiblank.bin.asr_inference\n"
    )
    found = _violations([("espnet_multiblank.espnet.model.bad", str(path))])
    assert found == [
        "espnet_multiblank.espnet.model.bad (model) imports inference",
        "espnet_multiblank.espnet.model.bad imports espnet_multiblank.bin (the entry "
        "points)",
    ]


def _fresh(code: str) -> str:
    env = dict(
        os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    env["ESPNET_MULTIBLANK_NO_AUTOREGISTER"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_importing_the_packages_does_not_import_espnet():
    names = [PREFIX] + [f"{PREFIX}.{g}" for g in SUBPACKAGES]
    out = _fresh(f"""
        import importlib, sys
        for name in {names!r}:
            importlib.import_module(name)
        espnet = ("espnet", "espnet2")
        print(sorted(m for m in sys.modules if m.split(".")[0] in espnet))
        """)
    assert out.strip() == "[]", out


def test_start_up_hook_paths_that_installed_files_name():
    """The .pth bootstrap imports espnet_multiblank.espnet._hook.find_and_wrap;
    setup.py loads espnet/autoregister.py by file path, without the package."""
    out = _fresh("""
        import importlib.util, sys
        path = "espnet_multiblank/espnet/autoregister.py"
        spec = importlib.util.spec_from_file_location("_mb_autoregister", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert not any(m.startswith("espnet_multiblank") for m in sys.modules)
        source = module.bootstrap_source()
        assert "from espnet_multiblank.espnet._hook import find_and_wrap" in source
        from espnet_multiblank.espnet._hook import find_and_wrap
        print(callable(find_and_wrap))
        """)
    assert out.strip() == "True"
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        setup_py = f.read()
    assert '"espnet_multiblank", "espnet", "autoregister.py"' in setup_py


@pytest.mark.parametrize(
    "old, new",
    [
        (
            "espnet_multiblank.espnet.model:MultiblankESPnetASRModel",
            "espnet_multiblank.espnet.model.asr_model:MultiblankESPnetASRModel",
        ),
        (
            "espnet_multiblank.espnet.registration:register",
            "espnet_multiblank.espnet.registration.class_choices:register",
        ),
    ],
)
def test_documented_import_paths_name_the_real_objects(old, new):
    import importlib

    def load(path):
        module, name = path.split(":")
        return getattr(importlib.import_module(module), name)

    assert load(old) is load(new)


def test_model_package_has_no_other_attributes():
    import espnet_multiblank.espnet.model as model_package

    with pytest.raises(AttributeError, match="no attribute 'MultiblankASRModel'"):
        model_package.MultiblankASRModel
