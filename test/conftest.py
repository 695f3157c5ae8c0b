"""Shared test set-up: the helpers' folder, the ``slow`` marker, and the CUDA
simulator's subprocess.

* ``test/helpers/`` (oracles, cases, check bodies, devices) is put on ``sys.path``.
* ``@pytest.mark.slow`` marks the tests that take minutes on a loaded 2-core machine;
  ``-m "not slow"`` leaves them out.
* Tests parametrised with ``device="sim"`` (``helpers/devices.py``) run in the CUDA
  simulator: after collection, ONE pytest subprocess with ``NUMBA_ENABLE_CUDASIM=1``
  runs exactly the selected ``sim`` tests (same files, same node ids) while this
  process runs the others; each ``sim`` test here then reports the subprocess's
  outcome of the same test (its traceback on failure, its reason on a skip). The
  subprocess also sets ``TRITON_INTERPRET=1``: there the fused loss's Triton tile
  kernels run in Triton's interpreter on the same CPU tensors, so that a ``sim``
  test of the fused loss runs its whole CUDA path (Triton tiles, CUDA lattice).
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "helpers"))

import devices  # noqa: E402
import simulator_fixes  # noqa: E402

#: the simulator's subprocess as a whole may take this long
SIM_TIMEOUT_S = 3600


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: takes minutes on a loaded 2-core machine (leave out: -m 'not slow')",
    )
    if devices.in_simulator_process():
        # the simulator's block manager polls its threads: a short switch interval
        # makes each simulated syncthreads much cheaper
        sys.setswitchinterval(1e-4)
        # ... which also makes a race of the simulator's own more likely
        simulator_fixes.make_shared_arrays_thread_safe()


def _is_sim(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("device") == "sim"


def _skipped_here(item) -> bool:
    return any(m.args and m.args[0] for m in item.iter_markers("skipif")) or any(
        True for _ in item.iter_markers("skip")
    )


def pytest_collection_modifyitems(config, items):
    if not devices.in_simulator_process():
        return
    with open(os.environ[devices.SIM_SELECTION_ENV]) as f:
        wanted = set(json.load(f))
    keep = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
    items[:] = keep


def pytest_collection_finish(session):
    """Start the simulator's subprocess for the selected ``sim`` tests, and run them
    last here (their outcome waits for it)."""
    config = session.config
    if devices.in_simulator_process() or config.option.collectonly:
        return
    sims = [i for i in session.items if _is_sim(i) and not _skipped_here(i)]
    if not sims:
        return
    others = [i for i in session.items if not _is_sim(i)]
    session.items[:] = others + [i for i in session.items if _is_sim(i)]
    if config.pluginmanager.hasplugin("timeout"):
        for item in sims:  # the first one waits for the whole subprocess
            item.add_marker(pytest.mark.timeout(SIM_TIMEOUT_S))
    work = tempfile.mkdtemp(prefix="sim_tests_")
    selection = os.path.join(work, "selection.json")
    report = os.path.join(work, "report.json")
    with open(selection, "w") as f:
        json.dump([i.nodeid for i in sims], f)
    files = sorted({i.nodeid.split("::")[0] for i in sims})
    env = dict(os.environ)
    env.update(
        {
            "NUMBA_ENABLE_CUDASIM": "1",
            "TRITON_INTERPRET": "1",
            devices.SIM_REPORT_ENV: report,
            devices.SIM_SELECTION_ENV: selection,
            "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        }
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    log = open(os.path.join(work, "log.txt"), "w")
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider"]
    cmd += [f"--rootdir={config.rootpath}", "-o", "addopts="]
    if config.pluginmanager.hasplugin("timeout"):
        cmd.append("--timeout=900")  # per test, as CI runs the suite
    proc = subprocess.Popen(
        cmd, cwd=str(config.rootpath), env=env, stdout=log, stderr=log
    )
    config._sim_run = dict(proc=proc, report=report, log=log.name, records=None)
    print(f"\n{len(sims)} tests run in the CUDA simulator's subprocess ({work})")


def _sim_records(config):
    run = config._sim_run
    if run["records"] is None:
        proc = run["proc"]
        try:
            proc.wait(timeout=SIM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            with open(run["report"]) as f:
                run["records"] = json.load(f)
        except (OSError, ValueError):
            run["records"] = {}
        if not run["records"]:
            with open(run["log"]) as f:
                run["error"] = f.read()[-4000:]
    return run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A ``sim`` test here: the outcome of the same test in the subprocess."""
    if devices.in_simulator_process() or not _is_sim(pyfuncitem):
        return None
    run = _sim_records(pyfuncitem.config)
    rec = run["records"].get(pyfuncitem.nodeid)
    if rec is None:
        pytest.fail(
            "did not run in the CUDA simulator's subprocess (rc "
            f"{run['proc'].returncode}): {run.get('error', '')}",
            pytrace=False,
        )
    if rec["outcome"] == "skipped":
        pytest.skip(rec["message"])
    if rec["outcome"] == "failed":
        pytest.fail(f"in the CUDA simulator:\n{rec['message']}", pytrace=False)
    return True


@pytest.fixture(autouse=True)
def _route_simulated_device(request, monkeypatch):
    """In the simulator's subprocess, a ``sim`` test's CPU tensors go to the CUDA
    kernels."""
    if devices.in_simulator_process() and _is_sim(request.node):
        devices.route_cpu_tensors_to_cuda_kernels(monkeypatch)
    yield


_RECORDS = {}


#: set (to a file name) by bench/gpu_check.sh: each failure's report is appended to
#: that file as it happens, so a run cut short by its time limit still tells why
FAILURES_AT_ONCE_ENV = "ESPNET_MULTIBLANK_FAILURES_TO"


def pytest_runtest_logreport(report):
    path = os.environ.get(FAILURES_AT_ONCE_ENV)
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n")
            f.write(str(report.longrepr)[-4000:] + "\n")
    if not devices.in_simulator_process():
        return
    if report.when == "call" or report.outcome != "passed":
        if report.skipped and isinstance(report.longrepr, tuple):
            message = report.longrepr[2]
        else:
            message = str(report.longrepr or "")
        previous = _RECORDS.get(report.nodeid)
        if previous is None or previous["outcome"] == "passed":
            _RECORDS[report.nodeid] = dict(outcome=report.outcome, message=message)


def pytest_sessionfinish(session):
    if devices.in_simulator_process():
        with open(os.environ[devices.SIM_REPORT_ENV], "w") as f:
            json.dump(_RECORDS, f)


@pytest.fixture(scope="session")
def onnx_export(tmp_path_factory):
    """``onnx_export(lattice, encoder, **kw)`` -> (experiment dir, exported dir) of
    a small random model (``helpers/export_cases.py``), made once per session."""
    import export_cases

    cache = {}
    root = tmp_path_factory.mktemp("onnx_exports")

    def get(lattice, encoder="chunk_conformer", **kw):
        return export_cases.exported(cache, root, lattice, encoder, **kw)

    return get
