"""Attention comparison as FlashAttention's own tests do it (pure).

``tests/test_flash_attn.py`` in flash-attention runs three computations on the same rounded
inputs: the kernel, an explicit attention in float32 (the reference), and the same explicit
attention in the kernel's dtype (what plain PyTorch would give). It then requires the
kernel's max error against the reference to be at most twice PyTorch's, for the output and
for dq, dk and dv. The bound scales with what the dtype can represent, so a kernel adding a
few percent of noise fails at every shape, while an honest kernel passes at any sequence
length, head dim or GQA ratio without a hand-tuned tolerance.

Those tests assert on the max error and print the mean; here both must hold. The max of a
long bf16 row is dominated by the PyTorch path's own outliers: on an H200 its bf16 max error
was 0.0159 at seqlen 1023 (GQA, head dim 128, non-causal), and 3 % output noise stayed under
twice that. The mean error is stable, and noise moves it by an order of magnitude.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stackpin_verify.checks import Metrics
from stackpin_verify.torchnames import CPU

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# flash-attention's tests: kernel error <= FACTOR x the same-dtype PyTorch error ...
FACTOR = 2.0
# ... for the output everywhere and for the gradients on accelerators. torch's fused CPU
# backward in fp16/bf16 keeps intermediate products in the low precision: on torch 2.13 its
# dv reached 3.26x PyTorch's error (causal, seqlen 113), so gradients on CPU get 4x.
CPU_GRAD_FACTOR = 4.0
# ... plus this much of max(1, max|reference|): room for float32 rounding in the reference
# itself (its tests add 3e-5 or the reference's own rounding), far below any real fault.
EPSILON = 1e-5
GRAD_NAMES = ("dq", "dk", "dv")


def torch_release() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def repeat_kv(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """K or V [B, Hkv, S, D] with each head repeated for its group of query heads."""
    return kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1)


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """Explicit softmax(QK^T/sqrt(d) + mask) V on [B, H, S, D], in the inputs' dtype."""
    k, v = repeat_kv(q, k), repeat_kv(q, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s_q, s_k = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """SDPA on [B, H, S, D]; GQA through ``enable_gqa`` from torch 2.5, by repeating the KV
    heads before (the cells pin torch down to 2.1)."""
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if torch_release() >= (2, 5):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, repeat_kv(q, k), repeat_kv(q, v), is_causal=causal)


@contextlib.contextmanager
def sdpa_math_path() -> Iterator[None]:
    """SDPA restricted to its math backend (torch.nn.attention from 2.3, the older
    torch.backends.cuda.sdp_kernel before)."""
    if torch_release() >= (2, 3):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            yield
        return
    with torch.backends.cuda.sdp_kernel(  # type: ignore[attr-defined,unused-ignore]
        enable_flash=False, enable_math=True, enable_mem_efficient=False
    ):
        yield


def make_qkv(
    shape_q: Sequence[int],
    shape_kv: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=CPU).manual_seed(seed)
    q = torch.randn(*shape_q, generator=gen)
    k = torch.randn(*shape_kv, generator=gen)
    v = torch.randn(*shape_kv, generator=gen)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


@dataclass(frozen=True)
class TensorError:
    """Max and mean absolute error against the reference: the kernel's, PyTorch's, and the
    bounds (factor x PyTorch's + epsilon)."""

    kernel: float
    pytorch: float
    bound: float
    factor: float
    mean_kernel: float = 0.0
    mean_pytorch: float = 0.0
    mean_bound: float = 0.0

    @property
    def max_ok(self) -> bool:
        return self.kernel <= self.bound  # NaN compares False: a NaN kernel fails

    @property
    def mean_ok(self) -> bool:
        return self.mean_kernel <= self.mean_bound

    @property
    def ok(self) -> bool:
        return self.max_ok and self.mean_ok

    def to_json(self) -> dict[str, float]:
        return {
            "kernel": self.kernel,
            "pytorch": self.pytorch,
            "bound": self.bound,
            "mean_kernel": self.mean_kernel,
            "mean_pytorch": self.mean_pytorch,
            "mean_bound": self.mean_bound,
        }


def tensor_error(
    got: torch.Tensor | None,
    pytorch: torch.Tensor | None,
    reference: torch.Tensor,
    *,
    factor: float = FACTOR,
    epsilon: float = EPSILON,
) -> TensorError:
    want = reference.detach()
    slack = epsilon * max(1.0, float(want.abs().max()))
    pt_max, pt_mean = _errors(pytorch, want)
    max_err, mean_err = _errors(got, want)
    return TensorError(
        kernel=max_err,
        pytorch=pt_max,
        bound=factor * pt_max + slack,
        factor=factor,
        mean_kernel=mean_err,
        mean_pytorch=pt_mean,
        mean_bound=factor * pt_mean + slack,
    )


def _errors(got: torch.Tensor | None, want: torch.Tensor) -> tuple[float, float]:
    """(max, mean) absolute error; a missing tensor is infinitely wrong."""
    if got is None:
        return float("inf"), float("inf")
    diff = (got.detach().to(want.dtype) - want).abs()
    return float(diff.max()), float(diff.mean())


def judge_errors(errors: dict[str, TensorError]) -> str | None:
    bad = []
    for name, err in errors.items():
        if not err.max_ok:
            bad.append(
                f"{name} error {err.kernel:.3g} > {err.bound:.3g} "
                f"({err.factor:g} x PyTorch's {err.pytorch:.3g} + epsilon)"
            )
        if not err.mean_ok:
            bad.append(
                f"{name} mean error {err.mean_kernel:.3g} > {err.mean_bound:.3g} "
                f"({err.factor:g} x PyTorch's {err.mean_pytorch:.3g} + epsilon)"
            )
    return "; ".join(bad) if bad else None


def _forward_backward(
    fn: AttnFn,
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    if not out.requires_grad or out.shape != grad_out.shape:
        # No graph, or an output of the wrong shape: compare_attention says which.
        return out, [None for _ in leaves]
    torch.autograd.backward(out, grad_tensors=grad_out.to(out.dtype))
    return out, [leaf.grad for leaf in leaves]


def compare_attention(
    fn: AttnFn,
    reference: AttnFn,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    factor: float = FACTOR,
    grad_factor: float | None = None,
) -> tuple[Metrics, str | None]:
    """Forward and backward of ``fn`` on ``inputs``, judged against ``reference`` (an
    explicit attention that runs in whatever dtype it is given) run twice: on float32
    copies (float64 when the inputs are float32) and on the inputs themselves."""
    if grad_factor is None:
        grad_factor = CPU_GRAD_FACTOR if inputs[0].device.type == CPU else factor
    wide = torch.float64 if inputs[0].dtype == torch.float32 else torch.float32
    wide_inputs = [t.detach().to(wide) for t in inputs]
    with torch.no_grad():
        out_shape = reference(*wide_inputs).shape
    gen = torch.Generator(device=CPU).manual_seed(99)
    grad_out = torch.randn(out_shape, generator=gen, dtype=wide).to(inputs[0].device)
    ref_out, ref_grads = _forward_backward(reference, wide_inputs, grad_out)
    pt_out, pt_grads = _forward_backward(reference, inputs, grad_out)
    out, grads = _forward_backward(fn, inputs, grad_out)
    metrics: Metrics = {
        "shape_q": list(inputs[0].shape),
        "shape_kv": list(inputs[1].shape),
        "dtype": str(inputs[0].dtype).removeprefix("torch."),
        "factor": factor,
        "grad_factor": grad_factor,
    }
    if out.shape != ref_out.shape:
        return metrics, f"output shape {list(out.shape)} != expected {list(ref_out.shape)}"
    errors = {"out": tensor_error(out, pt_out, ref_out, factor=factor)}
    for name, got, pt, want in zip(GRAD_NAMES, grads, pt_grads, ref_grads, strict=True):
        assert want is not None  # the reference is differentiable by construction
        errors[name] = tensor_error(got, pt, want, factor=grad_factor)
    metrics["errors"] = {name: err.to_json() for name, err in errors.items()}
    metrics["max_abs_diff"] = max(err.kernel for err in errors.values())
    metrics["error_ratio"] = max(_ratio(err) for err in errors.values())
    reason = judge_errors(errors)
    missing = [name for name, got in zip(GRAD_NAMES, grads, strict=True) if got is None]
    if missing:
        # An output without an autograd graph means backward cannot train through it.
        note = f"no gradient path: {', '.join(missing)} not computed"
        reason = f"{reason}; {note}" if reason else note
    return metrics, reason


def _ratio(err: TensorError) -> float:
    """The larger of max error / its bound and mean error / its bound (<= 1 passes)."""
    ratios = [
        got / bound if bound > 0 else float("inf")
        for got, bound in ((err.kernel, err.bound), (err.mean_kernel, err.mean_bound))
    ]
    return max(ratios)
