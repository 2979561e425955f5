"""Bridge: unsloth_zoo's CPU loader forwards Studio's ``on_model_resolved`` to transformers.

Upstream defect (unsloth_zoo 2026.10.9, ``unsloth_zoo/cpu/loader.py``): unsloth's GPU
loaders take ``on_model_resolved=`` and call it with the resolved model name before the
load (``unsloth/models/loader.py``); Studio's training worker passes it. The CPU loader,
``FastCPUModel.from_pretrained``, has no such parameter and forwards it in ``**kwargs`` to
``AutoModelForCausalLM.from_pretrained``, so ``Qwen2ForCausalLM.__init__`` fails with
"got an unexpected keyword argument 'on_model_resolved'" and every Train job on CPU dies
loading its model.

The bridge takes the keyword off and calls it as the GPU loaders do, with the name asked for.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any


def apply(module: types.ModuleType) -> None:
    loader = module.FastCPUModel
    original = loader.from_pretrained
    signature = inspect.signature(original)

    @functools.wraps(original)
    def from_pretrained(*args: Any, on_model_resolved: Any = None, **kwargs: Any) -> Any:
        if on_model_resolved is not None:
            bound = signature.bind_partial(*args, **kwargs)
            on_model_resolved(bound.arguments.get(
                "model_name", signature.parameters["model_name"].default))
        return original(*args, **kwargs)

    loader.from_pretrained = staticmethod(from_pretrained)
