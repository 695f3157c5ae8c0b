"""Tracing one module into one ONNX file: the step every exported graph goes
through (the native format's graphs, :mod:`.exporter`, and sherpa-onnx's,
:mod:`.sherpa`)."""

from pathlib import Path
from typing import Dict, Sequence

import torch

#: ONNX opset of the graphs
OPSET = 17


def export_graph(
    module: torch.nn.Module,
    args: tuple,
    path: Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    axes: Dict[str, Dict[int, str]],
    props: Dict[str, str],
) -> None:
    """``torch.onnx.export`` (TorchScript-based, opset :data:`OPSET`), then the
    metadata and ``onnx.checker``.

    Args:
        module: The module to trace (set to eval mode).
        args: Its example inputs (tensors of the shapes the docstrings give).
        path: The ``.onnx`` file to write.
        inputs, outputs: The graph's input and output names, in order.
        axes: The dynamic axes per input / output name (axis -> name).
        props: The metadata written into the graph (key -> value).
    """
    import warnings

    import onnx

    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer warns about Python ints from shapes; every value that depends
        # on a length is computed with tensor operations, and the verification
        # checks the graphs on other lengths and batch sizes than the traced ones
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in props.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(path))
