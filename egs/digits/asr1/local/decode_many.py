#!/usr/bin/env python3
"""Run many decodings of ``espnet_multiblank.bin.asr_inference`` in one process.

Each decoding started as its own process spends most of its start-up importing ESPnet
(about 17 s of a 2-core machine's time, more than many of the recipe's decodings take
to run); here the imports are paid once per worker. Each job is exactly the command
line the entry point would get: it is parsed by the entry point's own parser and run by
the same ``inference`` function, whose seed is set per job, so a job's outputs do not
depend on the jobs run before it in the process (``test/test_recipe_decode_many.py``
checks it against separate processes).

The queue file holds one job per line, its fields separated by tabs: the output
directory, then the entry point's arguments (``--output_dir`` excluded). Run one or
more workers on the same queue (``--worker`` only names them in the log): each claims
the next unclaimed job (an exclusively created file in ``QUEUE.claims/``), so that N
workers share the jobs in queue order. A job writes ``OUT.tmp/`` (its log first to
``OUT.tmp.log``: stdout and stderr, at the file-descriptor level, so ESPnet's logging
too), checks that ``1best_recog/text`` and ``decoding_stats.json`` were written and
renames it to ``OUT`` (so an existing ``OUT`` is always complete). A job that fails
(an exception, a non-zero exit status of the entry point, missing outputs) leaves
``OUT.tmp``, prints the end of its log to stderr, marks the queue failed (the other
workers stop claiming jobs) and makes the worker exit with status 1.

Usage::

    python local/decode_many.py QUEUE [--worker NAME]
"""

import argparse
import os
import shutil
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)


def read_queue(queue: Path) -> List[Tuple[str, List[str]]]:
    """The jobs of ``queue``: (output directory, arguments) per non-empty line."""
    jobs = []
    for number, line in enumerate(queue.read_text().splitlines(), 1):
        if not line.strip():
            continue
        out, *args = line.split("\t")
        if not out or "--output_dir" in args:
            raise ValueError(
                f"{queue}:{number}: expected OUT<TAB>ARG<TAB>ARG... without "
                f"--output_dir, got {line!r}"
            )
        jobs.append((out, args))
    return jobs


def claim(claims: Path, index: int) -> bool:
    """Claim job ``index`` for this worker; False when another worker has it."""
    try:
        os.close(os.open(claims / str(index), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def writes_to(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


@contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's output to ``log`` for the block: file descriptors 1 and 2
    (so also ``sys.stdout``/``sys.stderr``, logging handlers made before or during the
    block, C code writing there). Only where ``sys.stdout``/``sys.stderr`` are not
    those descriptors' (under pytest) are they replaced for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved_streams = None
    if not (writes_to(sys.stdout, 1) and writes_to(sys.stderr, 2)):
        saved_streams = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = open(os.dup(fd), "w", buffering=1)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if saved_streams is not None:
            sys.stdout.close()
            sys.stdout, sys.stderr = saved_streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def decode(args: List[str], output_dir: Path) -> int:
    """One run of the entry point (its parser, its ``inference``, its exit status);
    exceptions are printed and give status 1."""
    from espnet_multiblank.bin.asr_inference import exit_status, get_parser, inference

    print(" ".join(["asr_inference", *args, "--output_dir", str(output_dir)]))
    try:
        parsed = get_parser().parse_args([*args, "--output_dir", str(output_dir)])
        kwargs = vars(parsed)
        kwargs.pop("config", None)
        allow_failed = kwargs.pop("allow_failed_utterances")
        return exit_status(inference(**kwargs), allow_failed)
    except SystemExit as error:  # argparse errors
        return error.code if isinstance(error.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1


def run_job(out: Path, args: List[str]) -> bool:
    tmp = out.with_name(out.name + ".tmp")
    log = out.with_name(out.name + ".tmp.log")
    for path in (out, tmp):
        shutil.rmtree(path, ignore_errors=True)
    tmp.mkdir(parents=True)
    with output_to(log):
        status = decode(args, tmp)
    missing = [
        name
        for name in ("1best_recog/text", "decoding_stats.json")
        if not (tmp / name).is_file()
    ]
    if status != 0 or missing:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        why = f"exit status {status}" if status else f"no {', '.join(missing)}"
        print(f"decoding failed ({why}): {log}", file=sys.stderr)
        return False
    os.replace(log, tmp / "decode.log")
    os.replace(tmp, out)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queue", type=Path)
    parser.add_argument("--worker", default="0")
    opts = parser.parse_args(argv)
    jobs = read_queue(opts.queue)
    claims = opts.queue.with_name(opts.queue.name + ".claims")
    claims.mkdir(exist_ok=True)
    failed = claims / "failed"
    for index, (out, args) in enumerate(jobs):
        if failed.exists():
            return 1
        if not claim(claims, index):
            continue
        start = time.perf_counter()
        if not run_job(Path(out), args):
            failed.touch()
            return 1
        print(
            f"[decode_many {opts.worker}] {out}: {time.perf_counter() - start:.1f} s",
            file=sys.stderr,
        )
    return 1 if failed.exists() else 0


if __name__ == "__main__":
    sys.exit(main())
