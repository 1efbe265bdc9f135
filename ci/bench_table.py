#!/usr/bin/env python3
"""Markdown tables of Flint's headline benchmark figures, for ci/bench.

Usage: bench_table.py CRITERION_DIR LOADS_JSONL [LOAD_AVERAGE_NOTES]

* Criterion: every `*/new/estimates.json` under CRITERION_DIR with its `benchmark.json`; one row
  per benchmark with the median time (and rate when the bench declares a throughput), and for
  each group/parameter the ratio of every alternative's median to Flint's (the function whose
  name starts with `flint`): a ratio above 1 means Flint is faster.
* Load: one JSON object per line, as `flint-load --json` prints, with a `sweep` field added by
  ci/bench; one table per sweep.
"""

import json
import os
import sys
from collections import defaultdict
from statistics import median


def fmt_time(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.1f} ns"


def fmt_rate(per_s, unit):
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.2f} {suffix}{unit}/s"
    return f"{per_s:.1f} {unit}/s"


def criterion_rows(root):
    rows = []
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "estimates.json")) as f:
                estimates = json.load(f)
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                bench = json.load(f)
        except (OSError, ValueError) as e:
            print(f"bench_table: skipping {dirpath}: {e}", file=sys.stderr)
            continue
        median_ns = estimates["median"]["point_estimate"]
        throughput = bench.get("throughput") or {}
        rate = ""
        for kind, unit in (("Elements", "elem"), ("Bytes", "B"), ("BytesDecimal", "B")):
            if kind in throughput and median_ns > 0:
                rate = fmt_rate(throughput[kind] / (median_ns / 1e9), unit)
        rows.append(
            {
                "group": bench.get("group_id", "?"),
                "function": bench.get("function_id") or "",
                "param": bench.get("value_str") or "",
                "median_ns": median_ns,
                "rate": rate,
            }
        )
    rows.sort(key=lambda r: (r["group"], r["param"], not r["function"].startswith("flint"), "local" in r["function"], r["function"]))
    return rows


def criterion_table(rows):
    out = ["| group | parameter | implementation | median | rate | vs Flint |", "| --- | --- | --- | --- | --- | --- |"]
    by_key = defaultdict(list)
    for r in rows:
        by_key[(r["group"], r["param"])].append(r)
    for key in sorted(by_key):
        members = by_key[key]
        # The baseline is the first Flint entry (flint_loopback_* in e2e); other Flint variants
        # (e.g. local mode) get a ratio against it like the alternatives.
        flint = next((m for m in members if m["function"].startswith("flint")), None)
        for m in members:
            if flint is None or m is flint:
                ratio = "" if flint is None else "1.00 (Flint)"
            else:
                ratio = f"{m['median_ns'] / flint['median_ns']:.2f}x" if flint["median_ns"] > 0 else ""
            out.append(
                f"| {key[0]} | {key[1]} | {m['function']} | {fmt_time(m['median_ns'])} | {m['rate']} | {ratio} |"
            )
    return "\n".join(out)


SWEEP_COLUMNS = {
    "executors": ("executors", lambda r: r.get("executors")),
    "cores": ("cores per executor", lambda r: r.get("cores")),
    "payload": ("payload B", lambda r: r.get("payload")),
    "in_flight": ("in flight", lambda r: r.get("in_flight")),
    "batch": ("tasks per job", lambda r: r.get("batch")),
    "tasks_per_core": ("slots per core", lambda r: r.get("tasks_per_core")),
    # the same sweep in results from before it was renamed
    "queue_depth": ("slots per core", lambda r: r.get("queue_depth")),
}


def load_tables(path):
    sweeps = defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            sweeps[row.get("sweep", "load")].append(row)
    out = []
    for sweep, rows in sweeps.items():
        out.append(f"### {sweep}\n")
        if sweep == "queued_memory":
            out.append("| tasks | payload B | RSS before MiB | RSS after MiB | peak MiB | bytes per queued task | submit s |")
            out.append("| --- | --- | --- | --- | --- | --- | --- |")
            for r in rows:
                mib = lambda b: f"{b / 2**20:.1f}"
                out.append(
                    f"| {r['tasks']} | {r['payload']} | {mib(r['rss_before_bytes'])} | {mib(r['rss_after_bytes'])} "
                    f"| {mib(r['rss_peak_bytes'])} | {r['bytes_per_task']:.1f} | {r['submit_s']:.2f} |"
                )
            out.append("")
            continue
        if sweep == "ramp":
            for r in rows:
                out.append(f"knee: {r.get('knee_per_s')} tasks/s offered (load average {r.get('load_average', '?')})\n")
                out.append("| offered/s | achieved/s | p50 us | p99 us | p99.9 us | max us |")
                out.append("| --- | --- | --- | --- | --- | --- |")
                for s in r.get("steps", []):
                    l = s["latency_us"]
                    out.append(
                        f"| {s['rate_per_s']:.0f} | {s['tasks_per_s']:.0f} | {l['p50']} | {l['p99']} | {l['p999']} | {l['max']} |"
                    )
            out.append("")
            continue
        key = sweep.split(":")[0]
        label, get = SWEEP_COLUMNS.get(key, (key, lambda r: r.get(key)))
        # Repeated runs of one setting (BENCH_REPEAT) become one row of medians with the range
        # of tasks/s.
        groups = defaultdict(list)
        order = []
        for r in rows:
            k = get(r)
            if k not in groups:
                order.append(k)
            groups[k].append(r)
        out.append(f"| {label} | runs | all ok | tasks/s (median) | tasks/s range | p50 us | p99 us | p99.9 us | load avg |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for k in order:
            g = groups[k]
            ok = "yes" if all(r["succeeded"] == r["tasks"] for r in g) else "NO"
            med = lambda f: median([f(r) for r in g])
            rates = [r["tasks_per_s"] for r in g]
            loads = ",".join(str(r.get("load_average", "?")) for r in g)
            out.append(
                f"| {k} | {len(g)} | {ok} | {med(lambda r: r['tasks_per_s']):.0f} | {min(rates):.0f}-{max(rates):.0f} "
                f"| {med(lambda r: r['latency_us']['p50']):.0f} | {med(lambda r: r['latency_us']['p99']):.0f} "
                f"| {med(lambda r: r['latency_us']['p999']):.0f} | {loads} |"
            )
        out.append("")
    return "\n".join(out)


def headline(rows, loads_path):
    """The few figures that answer "how far from the goals", with their ratios."""
    out = ["| figure | Flint | alternative (ratio alternative/Flint) | load avg |", "| --- | --- | --- | --- |"]
    by = {(r["group"], r["function"]): r for r in rows}
    for group, label in (("e2e_job_10k_noop", "10k-noop job over loopback"), ("e2e_single_task", "one-task job round trip")):
        flint = by.get((group, "flint_loopback_2x1"))
        if not flint:
            continue
        alts = [r for (g, f), r in by.items() if g == group and r is not flint]
        alt_text = ", ".join(f"{a['function']} {fmt_time(a['median_ns'])} ({a['median_ns'] / flint['median_ns']:.2f}x)" for a in alts)
        rate = f" ({flint['rate']})" if flint["rate"] else ""
        out.append(f"| {label} (criterion median) | {fmt_time(flint['median_ns'])}{rate} | {alt_text} | see top |")
    loads = []
    if os.path.isfile(loads_path):
        with open(loads_path) as f:
            for line in f:
                try:
                    loads.append(json.loads(line))
                except ValueError:
                    pass
    rt = [r for r in loads if r.get("sweep") == "in_flight" and r.get("in_flight") == 1]
    if rt:
        p50 = median([r["latency_us"]["p50"] for r in rt])
        out.append(f"| one-task round trip p50 (flint-load --in-flight 1, goal 25 us) | {p50:.0f} us | - | {','.join(str(r.get('load_average')) for r in rt)} |")
    runs = [r for r in loads if "tasks_per_s" in r and r.get("sweep") not in ("ramp", "queued_memory")]
    if runs:
        best = max(runs, key=lambda r: r["tasks_per_s"])
        out.append(
            f"| best closed-loop tasks/s, executor processes (goal 1M) | {best['tasks_per_s']:.0f} ({best['sweep']}: "
            f"{best.get('executors')}x{best.get('cores')}, batch {best.get('batch')}, in flight {best.get('in_flight')}) | - | {best.get('load_average')} |"
        )
    for r in loads:
        if r.get("sweep") == "ramp":
            out.append(f"| open-loop knee (offered tasks/s) | {r.get('knee_per_s')} | - | {r.get('load_average')} |")
        if r.get("sweep") == "queued_memory":
            out.append(f"| driver memory per queued task ({r['tasks']} queued) | {r['bytes_per_task']:.0f} B | - | {r.get('load_average')} |")
    return "\n".join(out)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    criterion_dir, loads = sys.argv[1], sys.argv[2]
    rows = criterion_rows(criterion_dir) if os.path.isdir(criterion_dir) else []
    print("## Headline figures\n")
    print(headline(rows, loads))
    print()
    print("## Criterion medians (ratio = alternative / Flint; above 1 means Flint is faster)\n")
    if os.path.isdir(criterion_dir):
        print(criterion_table(rows))
    else:
        print(f"(no criterion results under {criterion_dir})")
    print("\n## Load sweeps (flint-load)\n")
    if os.path.isfile(loads):
        print(load_tables(loads))
    else:
        print(f"(no load results in {loads})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
