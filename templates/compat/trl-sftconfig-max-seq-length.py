"""Bridge: Studio builds trl's ``SFTConfig`` with ``max_seq_length``, which trl renamed.

Upstream defect (Studio in unsloth 2026.10.9, ``studio/backend/core/training/trainer.py``,
against trl 0.23.1): the trainer calls ``SFTConfig(**config_args)`` with
``max_seq_length``; trl's ``SFTConfig`` takes ``max_length`` (the old name is gone), so it
fails with "SFTConfig.__init__() got an unexpected keyword argument 'max_seq_length'". On a
GPU unsloth's patched trainer config accepts the old name; unsloth_zoo's CPU path renames it
only for ``SFTTrainer``, not for the config Studio builds first.

The bridge accepts the old name as ``max_length`` (both given and different: a TypeError).
"""

from __future__ import annotations

import functools
import types
from typing import Any

_UNSET = object()


def apply(module: types.ModuleType) -> None:
    config = module.SFTConfig
    original = config.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, max_seq_length: Any = _UNSET, **kwargs: Any) -> None:
        if max_seq_length is not _UNSET:
            if kwargs.get("max_length", max_seq_length) != max_seq_length:
                msg = (f"SFTConfig: max_seq_length={max_seq_length} and "
                       f"max_length={kwargs['max_length']} disagree; give max_length only")
                raise TypeError(msg)
            kwargs["max_length"] = max_seq_length
        original(self, *args, **kwargs)

    config.__init__ = __init__
