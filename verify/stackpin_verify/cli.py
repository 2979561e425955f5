"""Command line: argument parsing, the run, the printed summary, the exit code."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stackpin_verify import LEVELS, report
from stackpin_verify.torchnames import BACKEND_CPU

DEFAULT_IMAGE_INFO = Path("/opt/stackpin/image.json")


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        msg = f"--levels takes comma-separated numbers from {LEVELS[0]} to {LEVELS[-1]}: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    unknown = [level for level in levels if level not in LEVELS]
    if unknown or not levels:
        msg = f"unknown level(s) {unknown or text!r}; choose from {','.join(map(str, LEVELS))}"
        raise argparse.ArgumentTypeError(msg)
    return levels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stackpin_verify",
        description="Verify that a stackpin image (or this host) computes, trains and "
        "generates correctly. Writes report.json and report.xml.",
    )
    parser.add_argument(
        "--levels",
        type=parse_levels,
        default=None,
        help="comma-separated levels to run; each must pass at least one check (default: "
        "0-8, leaving out what cannot apply here: L2 without an accelerator, L4 without "
        "bitsandbytes installed or declared, L8 when the image declares no service)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("verify-report"),
        help="where report.json and report.xml go (default: ./verify-report)",
    )
    parser.add_argument(
        "--image-info",
        type=Path,
        default=None,
        help=f"image description (default: {DEFAULT_IMAGE_INFO} when it exists)",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp16", "fp32"),
        default="auto",
        help="precision for attention and training checks (default: auto)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the JSON report instead of the summary table"
    )
    return parser


def resolve_image_info(parser: argparse.ArgumentParser, given: Path | None) -> Path | None:
    if given is None:
        return DEFAULT_IMAGE_INFO if DEFAULT_IMAGE_INFO.exists() else None
    if not given.exists():
        parser.error(f"--image-info {given} does not exist")
    return given


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    image_path = resolve_image_info(parser, args.image_info)
    start = time.perf_counter()
    from stackpin_verify import environment, preflight

    broken = preflight.check_import()
    if broken is not None:
        # torch cannot be imported here without risking this process: report that alone.
        result = report.build_report(
            checks=[broken],
            host=environment.host_info(),
            image=_image_or_none(image_path),
            backend=BACKEND_CPU,
            versions={"python": platform.python_version(), "torch": "not importable"},
            devices=[],
            duration_s=time.perf_counter() - start,
        )
        return _emit(result, args, {})
    # torch and the levels load only after the arguments parsed: usage errors stay instant.
    from stackpin_verify import capability, recommend
    from stackpin_verify.runner import make_context, run_levels

    ctx = make_context(image_path=image_path, dtype_choice=args.dtype)
    requested = args.levels is not None
    checks, durations = run_levels(ctx, args.levels or LEVELS, requested=requested)
    result = report.build_report(
        checks=checks,
        host=environment.host_info(),
        image=ctx.image,
        backend=ctx.backend,
        versions=environment.versions(),
        devices=environment.devices(),
        duration_s=time.perf_counter() - start,
        device=capability.device_report(ctx.device),
        recommendation=recommend.recommend(
            checks, accelerated=ctx.accelerated, variant=(ctx.image or {}).get("variant")
        ),
    )
    return _emit(result, args, durations)


def _image_or_none(path: Path | None) -> dict[str, Any] | None:
    from stackpin_verify import environment

    if path is None:
        return None
    try:
        return environment.load_image_info(path)
    except environment.ImageInfoError:
        return None


def _emit(result: dict[str, Any], args: argparse.Namespace, durations: dict[int, float]) -> int:
    json_path, xml_path = report.write_reports(result, args.out_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(report.summary_table(result))
        print("per level: " + ", ".join(f"L{lvl} {sec:.1f} s" for lvl, sec in durations.items()))
        print(f"reports: {json_path} {xml_path}")
    sys.stdout.flush()
    return report.exit_code(result)
