"""The runtime's optional dependencies (pip extras): a missing one is an ImportError
that names the extra to install."""

import contextlib
from typing import Iterator


@contextlib.contextmanager
def needs_extra(what: str, extra: str) -> Iterator[None]:
    """Imports in the block; one that fails raises ImportError ``"{what}: pip
    install 'espnet-multiblank[{extra}]'"`` from the original error."""
    try:
        yield
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(f"{what}: pip install 'espnet-multiblank[{extra}]'") from e
