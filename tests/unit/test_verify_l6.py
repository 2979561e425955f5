"""L6 against the fixed model's float64 golden answers (issue 13 item 4): the golden file is
what its script writes, transformers' Qwen2 is the model the reference computes, an honest
CPU run passes in every dtype, and each kernel fault fails every golden case."""

from __future__ import annotations

import functools
import importlib.util
import json
import math

import pytest
import torch
import verify_helpers
from tests.tools import need_module

from stackpin_verify import fixedlm, golden, level6
from stackpin_verify.checks import CheckResult, run_check

need_module("transformers")

FAULTS_MODULE = verify_helpers.ROOT / "tests" / "faults" / "sitecustomize.py"
CPU = torch.device("cpu")


def _fault_patches(fault: str) -> list[tuple[object, str, object]]:
    """The same replacements `STACKPIN_FAULT=<fault>` makes in a real run (one home)."""
    spec = importlib.util.spec_from_file_location("stackpin_faults", FAULTS_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    patches: list[tuple[object, str, object]] = module.patches(fault)
    return patches


def _run_l6() -> dict[str, CheckResult]:
    ctx = verify_helpers.cpu_context()
    return {r.name: r for r in level6.run(ctx)}


# --- the generator and the weights ----------------------------------------------------------


def test_splitmix64_gives_the_published_outputs_for_seed_0():
    stream = fixedlm.IntStream(0)
    assert [stream.raw() for _ in range(4)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
        0xF88BB8A8724C81EC,
    ]


def test_every_weight_is_a_small_integer_times_a_power_of_two_exact_in_bf16_and_fp16():
    w = fixedlm.weights(golden.SEED)
    for name, _, exponent in fixedlm.tensor_plan():
        t = w[name]
        scaled = t * 2 ** (exponent or 0)
        assert torch.equal(scaled, scaled.round()), name
        assert int(scaled.abs().max()) <= fixedlm.WEIGHT_BOUND, name
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert torch.equal(t.to(dtype).double(), t), (name, dtype)


def test_weights_ignore_torchs_random_state():
    torch.manual_seed(1)
    first = fixedlm.weights(golden.SEED)
    torch.manual_seed(2)
    second = fixedlm.weights(golden.SEED)
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = fixedlm.weights(golden.SEED + 1)
    assert not torch.equal(first["lm_head.weight"], other["lm_head.weight"])


# --- the golden file ------------------------------------------------------------------------


def test_golden_file_is_what_its_script_writes(tmp_path):
    assert golden.main(["write", str(tmp_path / "g.json")]) == 0
    made = json.loads((tmp_path / "g.json").read_text())
    stored = json.loads(golden.GOLDEN_PATH.read_text())
    for key in ("schema", "command", "model", "tolerance", "margin_bound"):
        assert made[key] == stored[key], key
    assert len(made["cases"]) == len(stored["cases"]) == golden.CASES
    for new, old in zip(made["cases"], stored["cases"], strict=True):
        for key in ("prompt", "prompt_text", "tokens", "text"):
            assert new[key] == old[key], key
        # float64 on another CPU may sum in another order: the last bits may move.
        assert torch.allclose(
            torch.tensor(new["logits"]), torch.tensor(old["logits"]), rtol=1e-12, atol=1e-12
        )


def test_every_golden_step_clears_twice_the_loosest_tolerance():
    stored = golden.load()
    assert len(stored.cases) == golden.CASES
    loosest = max(golden.relative_tolerance(dt) for dt in golden.FACTOR)
    assert loosest == golden.relative_tolerance(golden.LOOSEST)
    for case in stored.cases:
        assert len(case.tokens) == len(case.logits) == golden.STEPS
        for token, row, margin, scale in zip(
            case.tokens, case.logits, case.margins, case.scales, strict=True
        ):
            assert row.index(max(row)) == token  # greedy: the golden token is the argmax
            assert margin > 2 * loosest * scale
        assert level6.detect_degenerate(fixedlm.text(case.tokens), case.tokens) is None


def test_margin_search_refuses_a_step_below_the_bound():
    row = [0.0] * fixedlm.SHAPE.vocab
    row[3], row[5] = 10.0, 10.0 - golden.margin_bound(10.0) * 0.99
    close = golden.Case([1, 2], [3], [row])
    assert not golden.acceptable(close)
    row[5] = 10.0 - golden.margin_bound(10.0) * 1.01
    assert golden.acceptable(golden.Case([1, 2], [3], [row]))
    assert not golden.acceptable(golden.Case([1], [3, 3, 3], [row, row, row]))


def test_tolerances_are_the_unit_roundoff_times_the_stated_factor():
    assert golden.relative_tolerance("bf16") == 6 * 2**-8
    assert golden.relative_tolerance("fp16") == 16 * 2**-11
    assert golden.relative_tolerance("fp32") == 64 * 2**-24


def test_transformers_qwen2_in_float64_is_the_reference_model():
    stored = golden.load()
    model = fixedlm.qwen2_model(fixedlm.weights(stored.seed), torch.float64, CPU)
    for case in stored.cases:
        for kv_cache in (False, True):
            found = fixedlm.device_greedy(model, case.prompt, golden.STEPS, CPU, kv_cache=kv_cache)
            assert found.tokens == case.tokens
            for row, want, scale in zip(found.logits, case.logits, case.scales, strict=True):
                # transformers computes the rotary angles in float32: ~1e-7 of the scale.
                assert float((row - torch.tensor(want)).abs().max()) < 1e-6 * scale


# --- honest CPU runs pass ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def honest() -> dict[str, CheckResult]:
    return _run_l6()


def test_l6_passes_on_cpu_in_every_dtype(honest):
    assert [(r.name, r.status, r.reason) for r in honest.values() if r.status != "pass"] == []
    for dtype in level6.DTYPE_NAMES:
        metrics = honest[f"L6.golden.{dtype}"].metrics
        assert metrics["exact"] == metrics["cases"] == 2 * golden.CASES
        assert metrics["paths"] == ["full", "kv_cache"]
        assert 0 < metrics["error_ratio"] < 1
    assert honest["L6.logits_finite"].metrics["steps"] == 3 * 2 * golden.CASES * golden.STEPS


def test_l6_does_not_train_or_touch_l5(honest):
    ctx = verify_helpers.cpu_context()
    level6.run(ctx)
    assert set(ctx.cache) == {"l6"}


# --- broken kernels fail -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    ["sdpa_noise", "linear_noise", "sdpa_causal_ignored", "rope_reversed", "logits_scaled"],
)
def test_kernel_fault_fails_every_golden_case_in_every_dtype(monkeypatch, fault):
    for owner, name, replacement in _fault_patches(fault):
        monkeypatch.setattr(owner, name, replacement)
    results = _run_l6()
    cases = 2 * golden.CASES
    for dtype in level6.DTYPE_NAMES:
        result = results[f"L6.golden.{dtype}"]
        assert result.status == "fail", (dtype, result.metrics)
        assert result.reason.startswith(f"{cases} of {cases} golden answers differ"), result.reason
        assert result.metrics["error_ratio"] > 1


def test_noise_that_keeps_every_token_still_fails_on_the_logits(monkeypatch):
    for owner, name, replacement in _fault_patches("logits_scaled"):
        monkeypatch.setattr(owner, name, replacement)
    result = _run_l6()["L6.golden.bf16"]
    assert result.metrics["exact"] == result.metrics["cases"]  # the tokens alone would pass
    assert "logits off by" in result.reason


def test_nan_logits_fail_golden_and_finite_checks(monkeypatch):
    def nan_forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        out.logits = out.logits * math.nan
        return out

    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.Qwen2ForCausalLM.forward
    monkeypatch.setattr(modeling_qwen2.Qwen2ForCausalLM, "forward", nan_forward)
    results = _run_l6()
    assert results["L6.golden.fp32"].status == "fail"
    assert results["L6.logits_finite"].status == "fail"
    assert "NaN" in results["L6.logits_finite"].reason


def test_model_repeating_one_token_fails_golden_and_degenerate():
    w = fixedlm.weights(golden.SEED)
    # A final norm of zeros: every logit 0 at every step, so argmax is token 0 every time.
    w["model.norm.weight"] = torch.zeros_like(w["model.norm.weight"])
    found = level6.generate(
        fixedlm.qwen2_model(w, torch.float32, CPU), "fp32", golden.load().cases, CPU
    )
    ctx = verify_helpers.cpu_context()
    degenerate = run_check("L6.degenerate", functools.partial(level6.check_degenerate, ctx, found))
    gold = run_check("L6.golden.fp32", functools.partial(level6.check_golden, ctx, "fp32", found))
    assert degenerate.status == "fail"
    assert f"one token (id 0) repeated {golden.STEPS} times" in degenerate.reason
    assert gold.status == "fail"


def test_an_answer_cut_short_fails():
    case = golden.load().cases[0]
    short = fixedlm.Decoded(case.tokens[:-1], [torch.tensor(r) for r in case.logits[:-1]])
    reason = level6.judge_generation(level6.Generation("fp32", "full", case, short))
    assert reason is not None
    assert f"{golden.STEPS - 1} steps, the golden answer has {golden.STEPS}" in reason
    assert level6.judge_golden([]) == "no golden case was generated"


def test_a_wrong_token_within_logit_tolerance_is_still_named():
    # Unreachable on an honest device (margins exceed twice the tolerance), so the judge
    # must not let the token comparison depend on the logits one.
    case = golden.load().cases[0]
    tokens = list(case.tokens)
    tokens[-1] = (tokens[-1] + 1) % fixedlm.SHAPE.vocab
    decoded = fixedlm.Decoded(tokens, [torch.tensor(r) for r in case.logits])
    reason = level6.judge_generation(level6.Generation("fp32", "kv_cache", case, decoded))
    assert reason is not None
    assert f"first difference at step {golden.STEPS - 1}" in reason


def test_a_fault_only_in_decode_time_attention_fails_the_kv_cache_path(monkeypatch):
    # One query row against the cache is where serving spends its time, and its kernels
    # differ from the prompt's: noise there alone must fail, and only those cases.
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def decode_noise(query, *args, **kwargs):
        out = sdpa(query, *args, **kwargs)
        if query.shape[-2] != 1:
            return out
        gen = torch.Generator().manual_seed(1)
        return out + 0.03 * out.abs() * torch.randn(out.shape, generator=gen).to(out.dtype)

    monkeypatch.setattr(F, "scaled_dot_product_attention", decode_noise)
    result = _run_l6()["L6.golden.bf16"]
    assert result.status == "fail"
    assert result.reason.startswith(f"{golden.CASES} of {2 * golden.CASES} golden answers")
    assert "bf16/kv_cache" in result.reason
    assert "bf16/full" not in result.reason


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("\"rsqrt_cpu\" not implemented for 'Half'", "skip"),  # an older CPU torch's answer
        ("CUDA error: no kernel image is available for execution on the device", "fail"),
    ],
)
def test_cpu_dtype_is_unsupported_only_on_the_dispatchers_message(monkeypatch, message, status):
    real = fixedlm.device_greedy

    def half_breaks(model, prompt, steps, device, *, kv_cache):
        if next(model.parameters()).dtype == torch.float16:
            raise RuntimeError(message)
        return real(model, prompt, steps, device, kv_cache=kv_cache)

    monkeypatch.setattr(fixedlm, "device_greedy", half_breaks)
    results = _run_l6()
    assert results["L6.golden.fp16"].status == status
    assert message in results["L6.golden.fp16"].reason
    assert results["L6.golden.fp32"].status == "pass"
    assert results["L6.golden.bf16"].status == "pass"


# --- the judge's edges, word for word (each closes a mutant the suite let live) -------------


def _exact(case: golden.Case) -> fixedlm.Decoded:
    """The golden answer itself, its logits kept in float64."""
    return fixedlm.Decoded(list(case.tokens),
                           [torch.tensor(row, dtype=torch.float64) for row in case.logits])


def test_golden_logits_are_read_in_float64():
    # Built in float32 the golden row would carry its own rounding, and a device that
    # reproduced the float64 reference exactly would show an error.
    case = golden.load().cases[0]
    errors = level6.step_errors(level6.Generation("fp32", "full", case, _exact(case)))
    assert errors == [0.0] * golden.STEPS


def test_an_error_exactly_at_the_tolerance_passes_and_just_above_fails():
    case = golden.load().cases[0]
    logits = [list(row) for row in case.logits]
    smallest = min(range(len(logits[0])), key=lambda i: abs(logits[0][i]))
    logits[0][smallest] = 0.0  # not the step's largest |logit|: the scale stays
    edge = golden.Case(prompt=list(case.prompt), tokens=list(case.tokens), logits=logits)
    tol = golden.relative_tolerance("fp32") * edge.scales[0]

    def judged(error: float) -> str | None:
        found = _exact(edge)
        found.logits[0][smallest] = error
        gen = level6.Generation("fp32", "full", edge, found)
        assert level6.step_errors(gen)[0] == error  # exactly, not approximately
        return level6.judge_generation(gen)

    assert judged(tol) is None
    reason = judged(math.nextafter(tol, math.inf))
    assert reason is not None and reason.startswith(f"{level6.Generation('fp32', 'full', edge, _exact(edge)).label}: step 0 logits off by")


def test_worst_ratio_of_no_steps_is_none():
    assert level6.worst_ratio([]) is None


def test_golden_reason_counts_all_and_quotes_the_first_three_word_for_word():
    case = golden.load().cases[0]
    short = fixedlm.Decoded(case.tokens[:-1], [torch.tensor(r) for r in case.logits[:-1]])
    found = [level6.Generation(dtype, path, case, short)
             for dtype in ("fp32", "bf16") for path in level6.PATHS]
    reasons = [level6.judge_generation(g) for g in found]
    prompt = fixedlm.text(case.prompt)
    steps = f"{golden.STEPS - 1} steps, the golden answer has {golden.STEPS}"
    assert reasons == [f"{label} prompt {prompt!r}: {steps}"
                       for label in ("fp32/full", "fp32/kv_cache", "bf16/full", "bf16/kv_cache")]
    assert level6.judge_golden(found) == (
        f"4 of 4 golden answers differ: {reasons[0]}; {reasons[1]}; {reasons[2]}"
    )
