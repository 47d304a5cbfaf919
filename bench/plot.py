#!/usr/bin/python3
"""PNG charts of cora's benchmarks from their JSON output.

Usage: bench/plot.py DATA_DIR OUT_DIR [--prefix NAME]

DATA_DIR holds the Google Benchmark JSON files of one run (roundtrip_bench.json,
pipeline_bench.json, wait_cost_bench.json, bandwidth_bench.json, engine_scaling_bench.json)
and/or cora-roundtrip.json; each chart is drawn from whichever of them is there, one per
device. Charts are written as OUT_DIR/NAME-<chart>-<device>.png (NAME defaults to DATA_DIR's
folder name). Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from goals import devices, load  # noqa: E402


def save(fig, out, prefix, chart, tag):
    path = os.path.join(out, f"{prefix}-{chart}-{tag}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def latency_by_policy(results, out, prefix, tag):
    rows = []
    for name in ("raw_event_spin", "raw_stream_sync", "raw_host_func"):
        v = results.get(f"roundtrip/{tag}/{name}")
        if v:
            rows.append((name.replace("_", " "), v["p50_us"], v["p99_us"], "raw"))
    for how in ("co_await", "async_wait"):
        for policy in ("spin", "hybrid", "blocking", "callback"):
            v = results.get(f"roundtrip/{tag}/cora_{how}/{policy}")
            if v:
                rows.append((f"cora {how} {policy}", v["p50_us"], v["p99_us"], how))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    colors = {"raw": "tab:gray", "co_await": "tab:blue", "async_wait": "tab:orange"}
    y = range(len(rows))
    ax.barh(y, [r[2] for r in rows], color=[colors[r[3]] for r in rows], alpha=0.3, label="p99")
    ax.barh(y, [r[1] for r in rows], color=[colors[r[3]] for r in rows], label="p50")
    ax.set_yticks(list(y), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("empty launch round trip (us): p50 solid, p99 light")
    ax.set_title(f"Awaited empty launch by completion policy ({tag})")
    save(fig, out, prefix, "latency-by-policy", tag)


def latency_from_tool(tool, out, prefix):
    rows = tool.get("roundtrips", [])
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    y = range(len(rows))
    color = ["tab:gray" if r["name"].startswith("raw") else "tab:blue" for r in rows]
    ax.barh(y, [r["p99_us"] for r in rows], color=color, alpha=0.3)
    ax.barh(y, [r["p50_us"] for r in rows], color=color)
    ax.set_yticks(list(y), [r["name"].replace("cora ", "") for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("empty launch round trip (us): p50 solid, p99 light; grey = raw driver")
    ax.set_title("cora-roundtrip: awaited empty launch by policy and marker")
    save(fig, out, prefix, "latency-by-policy", "cora-roundtrip")


def throughput_by_concurrency(results, out, prefix, tag):
    series = {}
    for key, v in results.items():
        m = re.match(rf"pipeline/{tag}/(cora|cora_spin)/K:(\d+)/C:(\d+)$", key)
        if m:
            series.setdefault((m.group(1), int(m.group(2))), []).append((int(m.group(3)), v["per_s"]))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for (kind, k), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o",
                linestyle="-" if kind == "cora" else ":",
                label=f"cora, K={k} threads" + (" (spin)" if kind == "cora_spin" else ""))
    for raw, style in (("raw_threads", "--"), ("raw_poll", "-.")):
        vals = [(v["per_s"], k.split("/")[-1]) for k, v in results.items() if k.startswith(f"pipeline/{tag}/{raw}/")]
        if vals:
            best, which = max(vals)
            ax.axhline(best / 1e3, color="black", linestyle=style, label=f"best {raw.replace('_', ' ')} ({which})")
    batched = [(int(m.group(2)), int(m.group(3)), int(m.group(1)), v["per_s"]) for key, v in results.items()
               for m in [re.match(rf"pipeline/{tag}/cora_batched/K:(\d+)/C:(\d+)/B:(\d+)$", key)] if m]
    for b in sorted({p[1] for p in batched}):
        pts = sorted((c, per, k) for c, bb, k, per in batched if bb == b)
        ax.scatter([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="^", label=f"cora batched B={b} (K=1,4)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent coroutines C")
    ax.set_ylabel("small pipelines per second (thousands)")
    ax.set_title(f"Small pipelines (4 KiB in, add, 2 KiB out) by concurrency ({tag})")
    ax.legend(fontsize=7)
    save(fig, out, prefix, "throughput-by-concurrency", tag)


def wait_cost(results, out, prefix, tag):
    pts = []
    for key, v in results.items():
        m = re.match(rf"wait_cost/{tag}/K:(\d+)/(.*)$", key)
        if m:
            pts.append((m.group(2).replace("cora/", "cora "), int(m.group(1)), v["cpu_s_per_s"], v["late_p50_us"]))
    if not pts:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, k in zip(axes, (1, 8)):
        for name, kk, cpu, late in pts:
            if kk != k:
                continue
            ax.scatter(late, cpu, marker="s" if name.startswith("raw") else "o")
            ax.annotate(name, (late, cpu), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("late p50 (us past the 1 ms kernel)")
        ax.set_ylabel("CPU seconds per wall second")
        ax.set_title(f"{k} waiter(s) ({tag})")
    fig.suptitle("Waiting on 1 ms kernels: CPU cost against lateness")
    save(fig, out, prefix, "wait-cost", tag)


def engine_scaling(results, out, prefix, tag):
    series = {}
    for key, v in results.items():
        m = re.match(rf"engine_scaling/{tag}/S:(\d+)/(.*)$", key)
        if m:
            series.setdefault(m.group(2), []).append((int(m.group(1)), v))
    if not series:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, pts in sorted(series.items()):
        pts.sort(key=lambda p: p[0])
        s = [p[0] for p in pts]
        axes[0].plot(s, [p[1]["resume_p50_us"] for p in pts], marker="o", label=f"{name} p50")
        axes[0].plot(s, [p[1]["resume_p99_us"] for p in pts], marker="x", linestyle=":", label=f"{name} p99")
        axes[1].plot(s, [p[1]["pending_cpu_s_per_s"] for p in pts], marker="o", label=name)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("streams S (the waits spread over them)")
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("resumption after the gate ends (us)")
    axes[1].set_ylabel("CPU s per s while all waits pend")
    fig.suptitle(f"Thousands of pending waits over S streams ({tag})")
    save(fig, out, prefix, "engine-scaling", tag)


def bandwidth(results, out, prefix, tag):
    ops = ("copy_h2d", "copy_d2h", "add_f32")
    raw = [results.get(f"bandwidth/{tag}/{o}/raw", {}).get("GB_per_s") for o in ops]
    cora = [results.get(f"bandwidth/{tag}/{o}/cora", {}).get("GB_per_s") for o in ops]
    if not any(raw) or not any(cora):
        return
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.4))
    for ax, o, r, c in zip(axes, ops, raw, cora):
        ax.bar(["raw", "cora"], [r or 0, c or 0], color=["tab:gray", "tab:blue"])
        ax.set_title(o)
        ax.set_ylabel("GB/s")
    fig.suptitle(f"Bandwidth, cora against raw ({tag})")
    save(fig, out, prefix, "bandwidth", tag)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    data, out = argv[1], argv[2]
    prefix = argv[argv.index("--prefix") + 1] if "--prefix" in argv else os.path.basename(os.path.normpath(data))
    os.makedirs(out, exist_ok=True)
    results = load(data)
    for tag in devices(results):
        latency_by_policy(results, out, prefix, tag)
        throughput_by_concurrency(results, out, prefix, tag)
        wait_cost(results, out, prefix, tag)
        engine_scaling(results, out, prefix, tag)
        bandwidth(results, out, prefix, tag)
    tool = os.path.join(data, "cora-roundtrip.json")
    if os.path.exists(tool):
        with open(tool) as f:
            latency_from_tool(json.load(f), out, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
