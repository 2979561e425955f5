from __future__ import annotations

from stackpin_verify.checks import CheckResult
from stackpin_verify.context import Context


def run(ctx: Context) -> list[CheckResult]:
    return []
