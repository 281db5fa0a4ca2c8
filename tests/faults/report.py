#!/usr/bin/env python3
"""Tables for a campaign report (docs/benchmarks/faults-*.md) from the
JSON that `campaign.py --json` writes: one row per cluster kind (faults by
kind, operations, violations, losses, convergence), one per planted bug
(which invariant caught it, after how long).

  report.py runs/*.json --plants plants/*.json
"""

import argparse
import json
from collections import Counter


def rows(paths):
    out = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        for kind, r in data.items():
            out.append((kind, r))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--plants", nargs="*", default=[])
    a = ap.parse_args()
    runs = rows(a.runs)
    if runs:
        print("| kind | seed | minutes | wait-replicas | operations | admissions | faults | "
              "violations | losses | convergence p50 / p99 / max (n) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for kind, r in runs:
            c = r["convergence"]
            faults = ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items()))
            losses = ", ".join(f"{k} {v}" for k, v in sorted(r["losses"].items())) or "none"
            viol = Counter(v["invariant"] for v in r["violations"])
            vtext = ", ".join(f"{k} {v}" for k, v in viol.items()) or "0"
            print(f"| {kind} | {r['seed']} | {r['seconds'] / 60:g} | {r['wait_replicas']} | "
                  f"{r['ops']:,} | {r['stats'].get('admissions', 0):,} | {faults} | {vtext} | "
                  f"{losses} | {c['p50']} / {c['p99']} / {c['max']} s ({c['n']}) |")
        print()
        total = Counter()
        for _, r in runs:
            total.update(r["faults"])
        print("Faults injected, all kinds: " + ", ".join(
            f"`{k}` {v}" for k, v in sorted(total.items())) + f" ({sum(total.values())}).")
        print()
        print("FIFO exceptions applied: " + "; ".join(
            f"{kind}: " + (", ".join(f"{k} {v}" for k, v in sorted(r["exceptions"].items())) or "none")
            for kind, r in runs) + ".")
        print()
    plants = rows(a.plants)
    if plants:
        print("| plant | kind | seed | caught by | first violation after | violations |")
        print("|---|---|---|---|---|---|")
        for kind, r in plants:
            viol = Counter(v["invariant"] for v in r["violations"])
            first = r.get("first_violation_t")
            caught = ", ".join(f"{k} ({v})" for k, v in viol.items()) or "**not caught**"
            print(f"| `{r.get('plant')}` | {kind} | {r['seed']} | {caught} | "
                  f"{'%.1f s' % first if first is not None else '–'} | {len(r['violations'])} |")


if __name__ == "__main__":
    main()
