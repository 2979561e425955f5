"""L5 judged tensor by tensor (issue 22). The total gradient norm and a falling loss pass an
adapter in which half the matrices never learn (B alone can memorise); so here:

- every lora_A and lora_B of every layer moves from its initial value by at least one
  Adam step (``lr``) and at most what ``steps`` Adam steps can move it;
- the optimizer stepped every adapter tensor once per training step;
- the round trip compares each saved tensor with the trained one, then the reloaded ones;
- after the reload, dropping any one layer's adapter changes the logits measurably.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from stackpin_verify.torchnames import CPU

# Adam's per-element step is at most lr (1 - beta1) / sqrt(1 - beta2) (Kingma & Ba 2015,
# section 2.1): 3.16 lr for torch's default betas (0.9, 0.999).
ADAM_STEP_BOUND = (1 - 0.9) / (1 - 0.999) ** 0.5
# Dropping a layer's adapter must move the largest logit by this many units of roundoff of
# the training dtype, times the largest logit: far above what rounding alone can do.
MEASURABLE_ROUNDOFFS = 64
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every lora_A / lora_B weight of the model, by parameter name, detached copies."""
    return {
        name: p.detach().clone()
        for name, p in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }


def short(name: str) -> str:
    """``base_model.model.model.layers.1.mlp.up_proj.lora_B.default.weight`` ->
    ``layers.1.mlp.up_proj.lora_B`` (what a reader needs to find the tensor)."""
    found = re.search(r"layers\.\d+\..*?lora_[AB]", name)
    return found.group(0) if found else name


def judge_moved(
    initial: Mapping[str, torch.Tensor],
    trained: Mapping[str, torch.Tensor],
    *,
    lr: float,
    steps: int,
) -> tuple[dict[str, float], str | None]:
    """(largest move per tensor, why some tensor moved too little or too much)."""
    if not initial:
        return {}, "the model has no lora_A / lora_B tensor"
    moves = {
        name: float((trained[name].double() - start.double()).abs().max())
        for name, start in initial.items()
    }
    upper = ADAM_STEP_BOUND * lr * steps
    still = [n for n, m in moves.items() if not m >= lr]
    wild = [n for n, m in moves.items() if m > upper]
    problems = []
    if still:
        shown = ", ".join(f"{short(n)} ({moves[n]:.3g})" for n in still[:4])
        problems.append(
            f"{len(still)} of {len(moves)} adapter tensors moved less than one Adam step "
            f"(lr {lr:g}) in {steps} steps: {shown}"
        )
    if wild:
        shown = ", ".join(f"{short(n)} ({moves[n]:.3g})" for n in wild[:4])
        problems.append(
            f"{len(wild)} adapter tensors moved more than {steps} Adam steps can "
            f"({upper:.3g}): {shown}"
        )
    return moves, "; ".join(problems) if problems else None


def judge_optimizer_steps(counts: Mapping[str, int], steps: int) -> str | None:
    """Every adapter tensor stepped once per training step."""
    if not counts:
        return "the optimizer holds no adapter tensor"
    wrong = {n: c for n, c in counts.items() if c != steps}
    if not wrong:
        return None
    shown = ", ".join(f"{short(n)} {c}" for n, c in list(wrong.items())[:4])
    return (
        f"{len(wrong)} of {len(counts)} adapter tensors were stepped a number of times "
        f"other than the {steps} training steps: {shown}"
    )


def judge_same_tensors(
    what: str, want: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor]
) -> str | None:
    """Each tensor of ``want`` in ``got``, bit for bit, and nothing else."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(
        n for n in set(want) & set(got) if not torch.equal(want[n].cpu(), got[n].cpu())
    )
    problems = []
    if missing:
        problems.append(f"missing {', '.join(short(n) for n in missing[:4])}")
    if extra:
        problems.append(f"unexpected {', '.join(short(n) for n in extra[:4])}")
    if differ:
        problems.append(f"differ: {', '.join(short(n) for n in differ[:4])}")
    if not want:
        problems.append("no adapter tensor to compare")
    if not problems:
        return None
    counts = f"({len(missing)} missing, {len(extra)} unexpected, {len(differ)} differ)"
    return f"{what} {counts}: {'; '.join(problems)}"


def saved_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """The adapter file save_pretrained wrote (safetensors, or the older .bin)."""
    safe = directory / "adapter_model.safetensors"
    if safe.exists():
        from safetensors.torch import load_file

        return dict(load_file(str(safe)))
    loaded: dict[str, torch.Tensor] = torch.load(
        directory / "adapter_model.bin", map_location=CPU, weights_only=True
    )
    return loaded


def peft_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter tensors under the names save_pretrained writes them with."""
    from peft import get_peft_model_state_dict

    state: dict[str, torch.Tensor] = get_peft_model_state_dict(model)
    return {k: v.detach().clone() for k, v in state.items()}


def layers_of(names: Sequence[str]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for name in names:
        match = _LAYER.search(name)
        if match:
            found.setdefault(int(match.group(1)), []).append(name)
    return found


def layer_ablation(
    model: torch.nn.Module, input_ids: torch.Tensor, dtype: torch.dtype
) -> tuple[dict[str, float], str | None]:
    """Drop each layer's adapter in turn (its lora_B set to zero, restored after) and
    measure how far the logits move; (moves by layer, why one layer moved them too little)."""
    params = dict(model.named_parameters())
    by_layer = layers_of([n for n in params if ".lora_B." in n])
    if not by_layer:
        return {}, "the reloaded model has no lora_B tensor"
    with torch.no_grad():
        full = model(input_ids=input_ids).logits.double()
        floor = MEASURABLE_ROUNDOFFS * torch.finfo(dtype).eps / 2 * float(full.abs().max())
        moves = {}
        for layer, names in sorted(by_layer.items()):
            saved = {n: params[n].detach().clone() for n in names}
            for n in names:
                params[n].zero_()
            dropped = model(input_ids=input_ids).logits.double()
            for n in names:
                params[n].copy_(saved[n])
            moves[f"layer {layer}"] = float((dropped - full).abs().max())
    weak = [f"{k} ({v:.3g})" for k, v in moves.items() if not v > floor]
    if weak:
        return moves, (
            f"dropping the adapter of {', '.join(weak)} moves the logits by at most "
            f"{floor:.3g} ({MEASURABLE_ROUNDOFFS} roundoffs of max|logit|): it contributes nothing"
        )
    return moves, None
