"""Issue 22's fault verdicts from one device run's reports: WORK holds honest/ and one
directory per fault (rc, report.json, stdout.txt); EXPECTATIONS (env) holds one
'fault|levels|must fail|must pass' line per fault. Writes OUT/summary.json. Pure: it runs
here as well as on the GPU host (python3 scripts/gpu/fault-summary.py WORK OUT)."""
import json, os, re, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
# What a fault wrapper's own breakage looks like (it proves nothing about the criterion).
HARNESS = re.compile(r"TypeError|unknown STACKPIN_FAULT|missing \d+ required positional")


def matches(name, wanted):
    return name == wanted or (wanted.endswith(".") and name.startswith(wanted))


def load(name):
    rc = int((work / name / "rc").read_text().strip())
    path = work / name / "report.json"
    checks = json.loads(path.read_text())["checks"] if path.exists() else []
    return rc, {c["name"]: c for c in checks}


def per_level(name):
    text = (work / name / "stdout.txt").read_text(errors="replace")
    found = re.search(r"^per level: (.*)$", text, re.M)
    return found.group(1) if found else None


summary = {}
rc, checks = load("honest")
report = json.loads((work / "honest" / "report.json").read_text())
new = ("padded", "range", "varlen_qk", "large_k", "edges", "batched", "tensors_learned",
       "optimizer_steps", "adapter_layers")
summary["honest"] = {
    "rc": rc,
    "summary": report["summary"],
    "per_level": per_level("honest"),
    "failed": sorted(n for n, c in checks.items() if c["status"] == "fail"),
    "issue22_checks": {n: c["status"] for n, c in checks.items() if any(k in n for k in new)},
}
for line in os.environ["EXPECTATIONS"].splitlines():
    fault, levels, must_fail, must_pass = line.split("|")
    rc, checks = load(fault)
    failing = {n: c for n, c in checks.items() if c["status"] == "fail"}
    fail = {}
    for wanted in must_fail.split():
        hit = {n: (c.get("reason") or "")[:240] for n, c in failing.items() if matches(n, wanted)}
        fail[wanted] = {"failed": sorted(hit), "harness_error": any(HARNESS.search(r) for r in hit.values()),
                        "first_reason": next(iter(hit.values()), None)}
    keep = {}
    for wanted in must_pass.split():
        named = [n for n in checks if matches(n, wanted)]
        keep[wanted] = {"checks": len(named),
                        "not_passed": sorted(n for n in named if checks[n]["status"] != "pass")}
    caught = (all(v["failed"] and not v["harness_error"] for v in fail.values())
              and all(v["checks"] and not v["not_passed"] for v in keep.values()))
    summary[fault] = {"levels": levels, "rc": rc, "caught": caught, "must_fail": fail,
                      "must_pass": keep, "failed": sorted(failing)}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({k: v.get("caught", v["rc"]) for k, v in summary.items()}, indent=1))
