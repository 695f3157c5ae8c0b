#!/usr/bin/env python3
"""Export a transducer trained with ESPnet (and the plug-in) to ONNX.

Usage::

    python -m espnet_multiblank.bin.export_onnx \\
        --asr_train_config exp/asr_multiblank/config.yaml \\
        --asr_model_file exp/asr_multiblank/valid.loss.ave.pth \\
        --output_dir exp/asr_multiblank/onnx

writes the directory that ``espnet_multiblank.runtime`` decodes without torch
(encoder.onnx, decoder.onnx, joint.onnx, tokens.txt and, for ``chunk_conformer``
models, frontend.onnx and encoder_chunk.onnx; docs/deploy.md). Every graph is checked
against the PyTorch model with ONNX Runtime before the directory is written; a model
the exporter cannot handle exactly is refused with a message that says why (exit
status 2).
"""

import argparse
import sys
from typing import List, Optional


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Export an ESPnet transducer (standard, multi-blank or TDT) to a "
        "directory of ONNX graphs for espnet_multiblank.runtime",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--asr_train_config", required=True, help="the training config (config.yaml)"
    )
    parser.add_argument(
        "--asr_model_file", required=True, help="the trained weights (*.pth)"
    )
    parser.add_argument(
        "--output_dir", required=True, help="the directory to write (must not exist)"
    )
    parser.add_argument(
        "--format",
        choices=["native", "sherpa_onnx"],
        default="native",
        help="native: the directory espnet_multiblank.runtime decodes (every "
        "lattice); sherpa_onnx: sherpa-onnx's NeMo transducer layout (standard and "
        "TDT models trained on frontend: kaldi_fbank)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --output_dir if it exists",
    )
    parser.add_argument(
        "--verify",
        choices=["true", "false"],
        default="true",
        help="compare every graph with PyTorch in ONNX Runtime before writing",
    )
    return parser


def main(cmd: Optional[List[str]] = None) -> int:
    args = get_parser().parse_args(cmd)
    import logging

    from espnet_multiblank.export import ExportError, export_model
    from espnet_multiblank.export.exporter import describe

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        info = export_model(
            args.asr_train_config,
            args.asr_model_file,
            args.output_dir,
            verify=args.verify == "true",
            overwrite=args.overwrite,
            format=args.format,
        )
    except (ExportError, FileExistsError) as e:
        print(f"export_onnx: {e}", file=sys.stderr)
        return 2
    print(f"exported to {args.output_dir}: {describe(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
