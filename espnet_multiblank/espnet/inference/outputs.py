"""What the decoding loops write: ESPnet's n-best lines, ``decoding_stats.json``,
``failed_utterances`` and the CTM of ``--write_ctm``; shared by the offline loop
(:mod:`.loop`) and the streaming one (:mod:`.stream_loop`)."""

import logging
from typing import Any, Dict, List, Optional, Tuple

import torch

# the decoding loop's logger (its summary line and failures)
logger = logging.getLogger("espnet_multiblank.asr_inference")

#: ``<output_dir>/failed_utterances``: one ``key reason`` line per failed utterance
FAILED_FILE = "failed_utterances"


class CtmWriter:
    """``<output_dir>/1best_recog/ctm``: the words of each 1-best with their start,
    duration and confidence (:mod:`.timestamps`, ``speech2text.word_times``), in
    input order, after a ``;;`` header that says what the times mean for the
    model's lattice.

    Raises:
        ValueError: the search gives no label timing (ESPnet's own searches), or the
            encoder frame shift cannot be measured.
    """

    def __init__(self, speech2text: Any, output_dir: str):
        from pathlib import Path

        from espnet_multiblank.espnet.inference.timestamps import ctm_header

        self.speech2text = speech2text
        try:  # before the file is opened: no empty CTM
            frame_shift = speech2text.frame_shift()
        except ValueError as e:
            raise ValueError(f"--write_ctm: {e}") from e
        # a TDT's label arcs cover frames: the CTM has the model's word durations
        lattice = getattr(speech2text, "lattice", None)
        tdt = lattice is not None and lattice.labels_move
        path = Path(output_dir) / "1best_recog" / "ctm"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "w", encoding="utf-8")
        for line in ctm_header(tdt, frame_shift):
            self.file.write(line + "\n")

    def write(self, key: str, result: Tuple) -> None:
        """The lines of one utterance's 1-best ``(text, token, token_int, hyp)``."""
        from espnet_multiblank.espnet.inference.timestamps import ctm_lines

        for line in ctm_lines(key, self.speech2text.word_times(result)):
            self.file.write(line + "\n")

    def close(self) -> None:
        self.file.close()


def result_problem(results: List) -> Optional[str]:
    """Why an n-best list must not be written (None when it can)."""
    if not results:
        return "the search returned no hypothesis"
    scores = [float(r[3].score) for r in results]
    if not all(map(torch.isfinite, torch.tensor(scores))):
        return (
            f"non-finite score {scores[0]} (the model's outputs are not finite for "
            "this input)"
        )
    return None


def write_results(writer: Any, key: str, results: List, nbest: int) -> None:
    """ESPnet's ``{n}best_recog/{token,token_int,score,text}`` lines of one
    utterance (scores as plain numbers)."""
    for n, (text, token, token_int, hyp) in zip(range(1, nbest + 1), results):
        ibest = writer[f"{n}best_recog"]
        ibest["token"][key] = " ".join(token)
        ibest["token_int"][key] = " ".join(map(str, token_int))
        ibest["score"][key] = str(float(hyp.score))
        if text is not None:
            ibest["text"][key] = text


def write_outputs(output_dir: str, stats: Dict[str, Any], failed: Dict[str, str]):
    """``decoding_stats.json``, ``failed_utterances`` and the summary log line."""
    from pathlib import Path

    from espnet_multiblank.espnet.inference.decoding_stats import write_decoding_stats

    write_decoding_stats(output_dir, stats)
    path = Path(output_dir) / FAILED_FILE
    if failed:
        with open(path, "w", encoding="utf-8") as f:
            for key, reason in failed.items():
                f.write(f"{key} {reason}\n")
        logger.error(
            "%d of %d utterances could not be decoded (%s)",
            len(failed),
            stats["num_utterances"],
            path,
        )
    elif path.exists():
        path.unlink()
    total = stats["total_frames"]
    skipped = 100.0 * stats["frames_skipped"] / total if total else 0.0
    logger.info(
        "decoding_stats: %d utts, %.2f s audio, %.2f s wall, RTF %.4f, %d frames, "
        "%d big blanks, %d frames skipped (%.1f%%)",
        stats["num_utterances"] - stats["num_failed"],
        stats["audio_seconds"],
        stats["decode_seconds"],
        stats["rtf"] or 0.0,
        total,
        stats["big_blank_emissions"],
        stats["frames_skipped"],
        skipped,
    )
