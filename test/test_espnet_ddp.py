"""Distributed (DDP) training through ESPnet on CPU, with the plug-in's entry point.

Real runs of a tiny ``multiblank_espnet`` model on 16 utterances, 2 ranks, gloo:

* torchrun with GPUs hidden (``CUDA_VISIBLE_DEVICES=``) and no ``--dist_backend``;
* the CPU spawn path (``--multiprocessing_distributed true --dist_world_size 2``);
* torchrun as two "nodes" on localhost (``--nnodes 2 --node_rank k``);
* ESPnet's stock ``espnet2.bin.asr_train`` registered by the start-up hook in every
  rank.

Each rank runs ``test/helpers/ddp_probe.py`` (the entry point with a probe that
records every rank's parameters and utterances per epoch). The runs without the hook set
``ESPNET_MULTIBLANK_NO_AUTOREGISTER=1``: the entry point alone must register in every
rank. Checked: the ranks' parameters are identical after every epoch and changed,
their utterances disjoint and together the whole set, the loss falls, and the
checkpoint rebuilds as the plug-in's model with the ranks' parameters.

Also: one step over 2 ranks x 4 utterances gives the parameters of one step in one
process over the 8 (loss "mean", FastEmit + clamp, "mean_label_normalized"; "sum"
gives half);
a rank that dies or hangs makes the run fail with a message naming it, in bounded time;
the option handling (backend default, timeout, spawn decision) in-process.
"""

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile
import torch
import yaml
from espnet_cases import TOKENS, tiny_config

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet import autoregister
from espnet_multiblank.espnet._hook import ENV_DISABLE
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.asr_model import MultiblankESPnetASRModel
from espnet_multiblank.espnet.training import cpu_spawn, ddp
from espnet_multiblank.espnet.training.task import MultiblankASRTask

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "helpers", "ddp_probe.py")
TEXTS = ["ab c", "ba", "cab", "c a", "abc", "b", "ca b", "aa"] * 2
UTTS = [f"utt{i:02d}" for i in range(len(TEXTS))]
N_EPOCHS = 3
RUN_TIMEOUT = 900  # a hung run fails the test instead of blocking the suite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """16 utterances (different lengths), char tokens, a tiny model's config."""
    root = tmp_path_factory.mktemp("ddp_data")
    rng = np.random.default_rng(0)
    with open(root / "wav.scp", "w") as scp, open(root / "text", "w") as txt:
        for i, (utt, text) in enumerate(zip(UTTS, TEXTS)):
            path = root / f"{utt}.wav"
            n = 3200 + 400 * (i % 3)
            soundfile.write(path, 0.1 * rng.standard_normal(n), 16000, subtype="PCM_16")
            scp.write(f"{utt} {path}\n")
            txt.write(f"{utt} {text}\n")
    (root / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
    config = tiny_config(ctc_weight=0.3)
    config.update(
        optim="adam",
        optim_conf=dict(lr=0.005),
        batch_type="unsorted",  # keys only: no collect_stats needed
        batch_size=8,  # global: 4 utterances per rank and step, 2 steps per epoch
        valid_batch_size=8,
        max_epoch=N_EPOCHS,
        num_att_plot=0,
        keep_nbest_models=1,
        use_tensorboard=False,
        use_matplotlib=False,
        best_model_criterion=[["valid", "loss", "min"]],
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


def _train_args(root, out, *extra):
    args = ["--config", f"{root}/train.yaml", "--output_dir", str(out)]
    args += ["--token_list", f"{root}/tokens.txt", "--token_type", "char"]
    args += ["--use_preprocessor", "true", "--ngpu", "0", "--num_workers", "0"]
    for mode in ("train", "valid"):
        args += [
            f"--{mode}_data_path_and_name_and_type",
            f"{root}/wav.scp,speech,sound",
        ]
        args += [f"--{mode}_data_path_and_name_and_type", f"{root}/text,text,text"]
        args += [f"--{mode}_shape_file", f"{root}/wav.scp"]
    return args + list(extra)


def _env(probe_dir, hook: bool, **extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", DDP_PROBE_DIR=str(probe_dir))
    for key in (ENV_DISABLE, "DDP_PROBE_FAIL", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    if not hook:
        env[ENV_DISABLE] = "1"
    env.update(extra)
    return env


def _torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _run(cmd, env, log, timeout=RUN_TIMEOUT):
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
        )
    text = open(log, errors="replace").read()
    return proc.returncode, text, time.monotonic() - t0


def _probe(probe_dir, rank, epoch):
    return torch.load(
        probe_dir / f"rank{rank}.epoch{epoch}.pt",
        map_location="cpu",
        weights_only=False,
    )


def _check_run(out, probe_dir, recorded_world, world=2):
    """The properties every 2-rank run must have (see the module docstring);
    ``recorded_world``: config.yaml's dist_world_size (None when torchrun's
    environment gave it)."""
    previous = None
    for epoch in range(1, N_EPOCHS + 1):
        ranks = [_probe(probe_dir, r, epoch) for r in range(world)]
        assert all(r["model_class"] == "MultiblankESPnetASRModel" for r in ranks)
        params = [r["params"] for r in ranks]  # parameters; buffers may differ
        for k, v in params[0].items():
            for other in params[1:]:
                assert torch.equal(v, other[k]), (epoch, k)
        if previous is not None:
            moved = [not torch.equal(v, previous[k]) for k, v in params[0].items()]
            assert sum(moved) > 0.9 * len(moved), epoch
        previous = params[0]
        ids = [set(r["ids"]) for r in ranks]
        assert all(len(i) == len(UTTS) // world for i in ids), ids
        assert set().union(*ids) == set(UTTS), ids  # disjoint, together the whole set

    ckpt = torch.load(out / "checkpoint.pth", map_location="cpu", weights_only=False)
    stats = ckpt["reporter"]["stats"]
    train = [float(stats[e]["train"]["loss"]) for e in range(1, N_EPOCHS + 1)]
    valid = [float(stats[e]["valid"]["loss"]) for e in range(1, N_EPOCHS + 1)]
    assert all(np.isfinite(train + valid)), (train, valid)
    assert train[-1] < 0.95 * train[0] and valid[-1] < valid[0], (train, valid)

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"] == "multiblank_espnet"
    assert (saved["distributed"], saved["dist_world_size"]) == (True, recorded_world)
    assert saved["dist_backend"] == "gloo"

    from espnet2.tasks.asr import ASRTask

    model, _ = ASRTask.build_model_from_file(
        out / "config.yaml", out / f"{N_EPOCHS}epoch.pth", "cpu"
    )
    assert isinstance(model, MultiblankESPnetASRModel)
    last = _probe(probe_dir, world - 1, N_EPOCHS)["params"]
    for k, v in model.named_parameters():
        assert torch.equal(v.detach(), last[k]), k
    # buffers (BatchNorm running statistics) are each rank's own; rank 0 saves
    state0 = _probe(probe_dir, 0, N_EPOCHS)["state"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, state0[k]), k
    return ranks


@pytest.mark.slow
def test_torchrun_gpus_hidden_no_hook(data, tmp_path):
    """torchrun, CUDA_VISIBLE_DEVICES= (LOCAL_RANK=1 failed ESPnet's device check),
    no --dist_backend (ESPnet's default nccl fails on CPU), start-up hook off."""
    out, probe = tmp_path / "exp", tmp_path / "probe"
    probe.mkdir()
    cmd = _torchrun("--standalone", "--nproc_per_node", "2", PROBE)
    env = _env(probe, hook=False, CUDA_VISIBLE_DEVICES="")
    rc, log, _ = _run(cmd + _train_args(data, out), env, tmp_path / "log")
    assert rc == 0, log[-5000:]
    _check_run(out, probe, recorded_world=None)


@pytest.mark.slow
def test_spawn_path_starts_cpu_workers_no_hook(data, tmp_path, monkeypatch):
    """--multiprocessing_distributed true --dist_world_size 2 --ngpu 0: two spawned CPU
    workers (ESPnet's spawn path starts GPU workers only); hook off."""
    out, probe = tmp_path / "exp", tmp_path / "probe"
    probe.mkdir()
    cmd = [sys.executable, PROBE] + _train_args(
        data, out, "--multiprocessing_distributed", "true", "--dist_world_size", "2"
    )
    env = _env(probe, hook=False)
    env.pop("OMP_NUM_THREADS", None)
    rc, log, _ = _run(cmd, env, tmp_path / "log")
    assert rc == 0, log[-5000:]
    ranks = _check_run(out, probe, recorded_world=2)
    # the workers ran without OMP_NUM_THREADS: expect what they computed then
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [r["threads"] for r in ranks] == [cpu_spawn.worker_threads(2)] * 2


@pytest.mark.slow
def test_torchrun_two_nodes_on_localhost(data, tmp_path):
    """Multi-node: two torchrun agents (--nnodes 2, --node_rank 0/1), one rank each,
    rendezvous at 127.0.0.1; start-up hook as installed in this environment."""
    out, probe = tmp_path / "exp", tmp_path / "probe"
    probe.mkdir()
    port = str(_free_port())
    env = _env(probe, hook=True)
    procs = []
    for node in (0, 1):
        cmd = _torchrun(
            "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", port, PROBE,
        )  # fmt: skip
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append(
            subprocess.Popen(
                cmd + _train_args(data, out), env=env, stdout=log, stderr=log
            )
        )
    try:
        rcs = [p.wait(timeout=RUN_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    assert rcs == [0, 0], [log[-3000:] for log in logs]
    _check_run(out, probe, recorded_world=None)


LAUNCH_WITH_HOOK = """
import runpy, site, sys
site.addsitedir(sys.argv.pop(1))  # processes the .pth: the start-up hook
runpy.run_module("espnet2.bin.asr_train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_stock_espnet_registers_in_every_rank_with_hook(data, tmp_path):
    """ESPnet's own entry point under torchrun: every rank parses the config and builds
    a multiblank_espnet model (--dry_run), registered by the start-up hook only."""
    site_dir = tmp_path / "site"
    autoregister.write(str(site_dir))
    launcher = tmp_path / "launch_stock.py"
    launcher.write_text(LAUNCH_WITH_HOOK)
    out = tmp_path / "exp"
    cmd = _torchrun("--standalone", "--nproc_per_node", "2", str(launcher))
    cmd += [str(site_dir)] + _train_args(data, out, "--dry_run", "true")
    cmd += ["--dist_backend", "gloo"]  # stock ESPnet: nccl by default
    rc, log, _ = _run(cmd, _env(tmp_path, hook=True), tmp_path / "log")
    assert rc == 0, log[-5000:]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"] == "multiblank_espnet" and saved["distributed"] is True


@pytest.mark.slow
def test_rank_that_dies_fails_the_run_at_once(data, tmp_path):
    """Spawn path: rank 1 exits without a Python error when epoch 2 starts; the run
    stops the other worker and fails, naming the rank and the exit code."""
    out, probe = tmp_path / "exp", tmp_path / "probe"
    probe.mkdir()
    cmd = [sys.executable, PROBE] + _train_args(
        data, out, "--multiprocessing_distributed", "true", "--dist_world_size", "2"
    )
    env = _env(probe, hook=False, DDP_PROBE_FAIL="1:2:exit")
    rc, log, _ = _run(cmd, env, tmp_path / "log")
    assert rc != 0
    assert "ddp_probe: rank 1 exit at epoch 2" in log, log[-3000:]
    assert "DDP worker rank 1 of 2 died (exit code 3)" in log, log[-3000:]
    assert not (out / f"{N_EPOCHS}epoch.pth").exists()


@pytest.mark.slow
def test_rank_that_hangs_fails_after_dist_timeout(data, tmp_path):
    """torchrun: rank 1 stops responding at epoch 2; rank 0 gives up after
    --dist_timeout (torch's default would be 30 min) with a message that says why,
    and torchrun ends the run."""
    out, probe = tmp_path / "exp", tmp_path / "probe"
    probe.mkdir()
    timeout = 20
    cmd = _torchrun("--standalone", "--nproc_per_node", "2", PROBE)
    cmd += _train_args(data, out, "--dist_timeout", str(timeout))
    env = _env(probe, hook=False, DDP_PROBE_FAIL="1:2:hang")
    rc, log, _ = _run(cmd, env, tmp_path / "log")
    hang_started = (probe / "hang_started").stat().st_mtime
    assert rc != 0
    assert "DDP rank 0 of 2: a collective operation failed" in log, log[-3000:]
    assert f"--dist_timeout {timeout} s" in log
    assert "DistributedTrainingError" in log
    # the timeout, not the test's subprocess limit, ended the run (torchrun's own
    # shutdown of the hung rank included)
    assert time.time() - hang_started < timeout + 120


@pytest.mark.slow
def test_one_step_over_two_ranks_equals_one_process_over_the_global_batch(tmp_path):
    """2 ranks x 4 utterances vs 1 process x 8, one SGD step through ESPnet's trainer:
    the same parameters for "mean", FastEmit + clamp and "mean_label_normalized"
    (per-utterance losses; ESPnet weights each rank by its batch share and DDP
    averages); "sum" moves the parameters half as far (documented in
    docs/espnet_integration.md); the fused joint + loss
    (model_conf.transducer_fused_joint) gives "mean"'s step."""
    import ddp_grad_case as case

    case.write_configs(str(tmp_path))
    torch.multiprocessing.start_processes(
        case.rank_main,
        args=(2, str(tmp_path), _free_port()),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    deltas = {}
    for variant in case.VARIANTS:
        single = case.one_step(str(tmp_path), variant, rank=0, world=1)
        ranks = [torch.load(tmp_path / f"{variant}.rank{r}.pt") for r in (0, 1)]
        assert sorted(ranks[0]["ids"] + ranks[1]["ids"]) == sorted(single["ids"])
        factor = 0.5 if variant == "sum" else 1.0
        delta_1, delta_2 = {}, {}
        for k, p0 in single["before"].items():
            assert torch.equal(p0, ranks[0]["before"][k]), k  # same initial model
            assert torch.equal(ranks[0]["after"][k], ranks[1]["after"][k]), k
            delta_1[k] = single["after"][k] - p0
            delta_2[k] = ranks[0]["after"][k] - p0
        flat_1 = torch.cat([d.flatten() for d in delta_1.values()]).double()
        flat_2 = torch.cat([d.flatten() for d in delta_2.values()]).double()
        scale = flat_1.abs().max()
        assert scale > 1e-4, variant  # the step did move the parameters
        err = (flat_2 - factor * flat_1).abs().max() / scale
        assert err < 1e-5, (variant, float(err))  # float32 sums: ~1e-7 seen
        deltas[variant] = flat_1
    # the clamp was active (otherwise the variant would not test it)
    diff = (deltas["fastemit_clamp"] - deltas["mean"]).abs().max()
    assert diff > 0.05 * deltas["mean"].abs().max()
    # model_conf.transducer_fused_joint: the dense model's step
    err = (deltas["fused_mean"] - deltas["mean"]).abs().max() / deltas[
        "mean"
    ].abs().max()
    assert err < 1e-5, float(err)


# ------------------------------------------------------------ in-process option checks
def _parse(*extra):
    return MultiblankASRTask.get_parser().parse_args(list(extra))


def test_backend_defaults_by_device():
    assert ddp.prepare(_parse("--ngpu", "0")).dist_backend == "gloo"
    assert ddp.prepare(_parse("--ngpu", "1")).dist_backend == "nccl"
    assert ddp.prepare(
        _parse("--dist_backend", "gloo", "--ngpu", "1")
    ).dist_backend == ("gloo")
    # a namespace from ESPnet's stock parser keeps its explicit value
    from espnet2.tasks.asr import ASRTask

    stock = ASRTask.get_parser().parse_args([])
    assert ddp.prepare(stock).dist_backend == "nccl" and stock.dist_timeout is None


def test_nccl_on_cpu_is_refused_with_the_flag_named():
    args = ddp.prepare(_parse("--ngpu", "0", "--dist_backend", "nccl"))
    args.distributed = True
    with pytest.raises(ConfigError, match=r"--dist_backend nccl needs GPUs"):
        ddp.prepare_worker(args)
    args.distributed = False  # a single-process run never uses the backend
    ddp.prepare_worker(args)


def test_cpu_rank_local_rank_is_not_checked_against_hidden_gpus(monkeypatch):
    from espnet2.train.distributed_utils import DistributedOption

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("LOCAL_RANK", "1")
    args = _parse("--ngpu", "0")
    args.distributed = True
    opt = DistributedOption(distributed=True, ngpu=0, dist_rank=1, dist_world_size=2)
    opt.dist_init_method = "tcp://127.0.0.1:1"
    with pytest.raises(RuntimeError, match="LOCAL_RANK=1 is bigger"):
        opt.init_options()  # ESPnet as is
    ddp.prepare_worker(args)
    opt.local_rank = args.local_rank
    opt.init_options()
    assert opt.local_rank == 0


@pytest.mark.parametrize("bad", ["0", "-5", "abc", "inf", "nan"])
def test_dist_timeout_must_be_positive_seconds(bad, capsys):
    with pytest.raises(SystemExit):
        _parse("--dist_timeout", bad)
    assert (
        "--dist_timeout must be a positive number of seconds" in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match="--dist_timeout must be a positive"):
        ddp.prepare(argparse.Namespace(ngpu=0, dist_backend=None, dist_timeout=bad))
    assert _parse("--dist_timeout", "12.5").dist_timeout == 12.5
    assert _parse().dist_timeout is None


def test_spawn_path_decision(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    on = ("--multiprocessing_distributed", "true", "--ngpu", "0")
    assert ddp.cpu_spawn_world_size(_parse(*on, "--dist_world_size", "3")) == 3
    assert ddp.cpu_spawn_world_size(_parse(*on, "--dist_world_size", "1")) == 0
    assert ddp.cpu_spawn_world_size(_parse(*on)) == 0
    # GPUs, no multiprocessing flag, a node rank or a launcher: ESPnet's own paths
    gpu = ("--multiprocessing_distributed", "true", "--ngpu", "2")
    assert ddp.cpu_spawn_world_size(_parse(*gpu, "--dist_world_size", "2")) == 0
    assert ddp.cpu_spawn_world_size(_parse("--dist_world_size", "2")) == 0
    node = ("--dist_world_size", "2", "--dist_rank", "1")
    assert ddp.cpu_spawn_world_size(_parse(*on, *node)) == 0
    monkeypatch.setenv("RANK", "0")
    assert ddp.cpu_spawn_world_size(_parse(*on, "--dist_world_size", "2")) == 0
    with pytest.raises(ConfigError, match="--dist_world_size must be >= 1"):
        monkeypatch.delenv("RANK")
        ddp.cpu_spawn_world_size(_parse(*on, "--dist_world_size", "0"))


def test_process_group_timeout_reaches_init_process_group(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append(k))
    fake = dist.init_process_group
    with ddp.process_group_timeout(7):
        dist.init_process_group(backend="gloo")
        dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=3))
    assert dist.init_process_group is fake  # restored
    with ddp.process_group_timeout(None):
        dist.init_process_group(backend="gloo")
    assert [c.get("timeout") for c in calls] == [
        datetime.timedelta(seconds=7),
        datetime.timedelta(seconds=3),
        None,
    ]


def test_failed_collective_is_explained():
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out")
        with pytest.raises(ddp.DistributedTrainingError) as info:
            with ddp.explain_rank_failure(15):
                raise gloo
        assert "DDP rank 0 of 1: a collective operation failed" in str(info.value)
        assert "--dist_timeout 15 s" in str(info.value)
        assert info.value.__cause__ is gloo
        with pytest.raises(ValueError, match="unrelated"):  # other errors unchanged
            with ddp.explain_rank_failure(15):
                raise ValueError("unrelated")
    finally:
        dist.destroy_process_group()


_EXIT_CASE = r"""
import logging, sys
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
from espnet_multiblank.espnet.training import ddp

logging.basicConfig(filename=sys.argv[2], level=logging.INFO)
ddp.exit_finished_rank()  # no DDP training finished yet: returns
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3],
                        rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
model(torch.randn(4, 3)).sum().backward()
# left open, as ESPnet's trainer leaves it; holds every event until flushed
writer = SummaryWriter(sys.argv[1], max_queue=1000, flush_secs=3600)
for step in range(40):
    writer.add_scalar("loss", float(step), step)
logging.info("last line before the exit")
print("stdout tail", end="")
ddp.finish_process_group()
ddp.exit_finished_rank()
sys.exit(7)  # not reached
""".replace("import logging, sys", "import logging, sys\nimport torch")


def test_finished_rank_exits_with_status_0_and_keeps_its_output(tmp_path):
    """After a DDP training, the plug-in's entry points end the process with
    ``ddp.exit_finished_rank`` (skipping torch's teardown, which can abort after DDP):
    status 0, and the tensorboard events, log and stdout written before it all kept."""
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    script = tmp_path / "case.py"
    script.write_text(_EXIT_CASE)
    board, log = tmp_path / "board", tmp_path / "log.txt"
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)  # stdout to a pipe: block-buffered
    proc = subprocess.run(
        [sys.executable, str(script), str(board), str(log), str(_free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "espnet_multiblank" not in proc.stderr  # no warning from the ending
    assert proc.stdout.endswith("stdout tail")
    assert "last line before the exit" in log.read_text()
    events = EventAccumulator(str(board))
    events.Reload()
    steps = [e.step for e in events.Scalars("loss")]
    assert steps == list(range(40))
