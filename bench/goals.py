#!/usr/bin/python3
"""The performance goals of cora against the raw driver, from the benchmarks' JSON output.

Usage: bench/goals.py BENCH_JSON_DIR [--json OUT.json]

Reads the Google Benchmark JSON files (roundtrip_bench.json, pipeline_bench.json, ...) and
cora-roundtrip.json of one run, and prints one table per device: each goal's measured ratio
(cora against raw, same run), the goal, and pass or miss. The goals are the H200's; on the
CPU device the same table is printed for information, except the rows marked "(CPU goal)" and
the add_custom_tiling and reduce_u32 rows, which are the CPU device's own goals. Standard library only.
"""
import json
import os
import re
import statistics
import sys

SUFFIX = re.compile(r"/(iterations:\d+|repeats:\d+|real_time|manual_time|min_time:[^/]+)")


def load(folder):
    """{benchmark key: {counter: value}}; repetitions reduced to their median."""
    runs = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name == "cora-roundtrip.json" or name == "goals.json":
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            key = SUFFIX.sub("", b["name"])
            runs.setdefault(key, []).append(b)
    out = {}
    for key, bs in runs.items():
        counters = {}
        for k in bs[0]:
            vals = [b[k] for b in bs if isinstance(b.get(k), (int, float)) and not isinstance(b.get(k), bool)]
            if vals:
                counters[k] = statistics.median(vals)
        out[key] = counters
    return out


def devices(results):
    tags = sorted({k.split("/")[1] for k in results if k.count("/") >= 2 and re.match(r"(cuda|cpu)\d+$", k.split("/")[1])})
    return sorted(tags, key=lambda t: (not t.startswith("cuda"), t))


def get(results, key, counter):
    return results.get(key, {}).get(counter)


def best(results, prefix, counter, pred=lambda k: True):
    """(key, value) of the highest `counter` among keys starting with `prefix`."""
    cands = [(v[counter], k) for k, v in results.items() if k.startswith(prefix) and counter in v and pred(k)]
    if not cands:
        return None, None
    v, k = max(cands)
    return k, v


def goals_for(results, tag, roundtrip_tool, default_device=False):
    rows = []  # (goal text, measured text, ratio, limit, higher_is_better, note)

    def ratio_row(text, num, den, limit, higher, note=""):
        ratio = num / den if num is not None and den else None
        rows.append((text, ratio, limit, higher, note))

    # 1. Round trip of an awaited empty launch.
    raw = get(results, f"roundtrip/{tag}/raw_event_spin", "p50_us")
    base_note = "raw: launch + event + busy poll"
    if raw is None:
        raw = get(results, "roundtrip/raw_asio_post_ping_pong", "p50_us")
        base_note = "no driver: against an Asio cross-thread post"
    for policy, limit in (("spin", 1.05), ("hybrid", 1.15)):
        c = get(results, f"roundtrip/{tag}/cora_co_await/{policy}", "p50_us")
        # The goal reads the paired row (raw and cora alternately in one loop) where there is
        # one: the separate rows, run seconds apart, drift apart by more than the margin.
        pc = get(results, f"roundtrip/{tag}/paired/{policy}", "cora_p50_us")
        pr = get(results, f"roundtrip/{tag}/paired/{policy}", "raw_p50_us")
        if pc is not None and pr:
            ratio_row(f"round trip p50, co_await, {policy}, alternately", pc, pr, limit, False,
                      f"{pc:.2f} us vs {pr:.2f} us (raw: launch + event + busy poll)")
            ratio_row(f"round trip p50, co_await, {policy}, separate rows (info)", c, raw, limit, False,
                      f"{c:.2f} us vs {raw:.2f} us" if c and raw else "")
        else:
            ratio_row(f"round trip p50, co_await, {policy}", c, raw, limit, False,
                      f"{c:.2f} us vs {raw:.2f} us ({base_note})" if c and raw else "")
        a = get(results, f"roundtrip/{tag}/cora_async_wait/{policy}", "p50_us")
        ratio_row(f"round trip p50, async_wait, {policy} (same goal)", a, raw, limit, False,
                  f"{a:.2f} us" if a else "")
    if roundtrip_tool and tag.startswith("cuda"):
        rts = {r["name"]: r for r in roundtrip_tool.get("roundtrips", [])}
        raw_t = rts.get("raw launch + event record + busy cuEventQuery", {}).get("p50_us")
        for policy, limit in (("spin", 1.05), ("hybrid", 1.15)):
            pc = rts.get(f"cora co_await launch ({policy}, auto markers, alternately)", {}).get("p50_us")
            pr = rts.get(f"raw launch + event record + busy cuEventQuery (alternately, {policy})", {}).get("p50_us")
            if pc and pr:  # the tool's raw and cora round trips taken in turn
                ratio_row(f"round trip p50, co_await, {policy} (cora-roundtrip, alternately)", pc, pr, limit, False,
                          f"{pc:.2f} us vs {pr:.2f} us")
                continue
            c = (rts.get(f"cora co_await launch ({policy}, auto markers)")  # the default
                 or rts.get(f"cora co_await launch ({policy}, counter markers)", {})).get("p50_us")
            ratio_row(f"round trip p50, co_await, {policy} (cora-roundtrip)", c, raw_t, limit, False,
                      f"{c:.2f} us vs {raw_t:.2f} us" if c and raw_t else "")

    # 2. Small pipelines: cora with K executor threads against raw with K threads, and the
    # best of each.
    rk, rv = best(results, f"pipeline/{tag}/raw_", "per_s")
    kof = lambda k: int(re.search(r"/K:(\d+)/", k).group(1))
    plain = lambda k: re.match(rf"pipeline/{tag}/cora(_spin|_per_thread)?/K:\d+/", k) is not None
    ck, cv = best(results, f"pipeline/{tag}/cora", "per_s", lambda k: plain(k) and kof(k) <= 16)
    bk, bv = best(results, f"pipeline/{tag}/cora_batched/", "per_s")
    short = lambda k: k.split("/", 2)[2] if k else "-"
    for threads in (1, 4, 16):
        tk, tv = best(results, f"pipeline/{tag}/cora", "per_s",
                      lambda k, t=threads: plain(k) and kof(k) == t)
        raw_t = get(results, f"pipeline/{tag}/raw_threads/T:{threads}", "per_s")
        ratio_row(f"small pipelines/s, cora K={threads} / raw {threads} threads", tv, raw_t, 1.0, True,
                  f"{tv:,.0f}/s ({short(tk)}) vs {raw_t:,.0f}/s" if tv and raw_t else "")
    ratio_row("small pipelines/s, best cora (K <= 16) / best raw", cv, rv, 1.0, True,
              f"{cv:,.0f}/s ({short(ck)}) vs {rv:,.0f}/s ({short(rk)})" if cv and rv else "")
    ratio_row("small pipelines/s, batched / best raw unbatched", bv, rv, 2.0, True,
              f"{bv:,.0f}/s ({short(bk)})" if bv else "")

    # 3. Waiting on 1 ms kernels: the goals are issue 19's, with 8 waiters; one waiter is shown
    # for information.
    for k in ("1", "8"):
        info = " (info)" if k == "1" else ""
        hy = get(results, f"wait_cost/{tag}/K:{k}/cora/hybrid", "cpu_s_per_s")
        bs = get(results, f"wait_cost/{tag}/K:{k}/raw_blocking_sync", "cpu_s_per_s")
        ratio_row(f"1 ms waits, K={k}: hybrid CPU s/s / blocking-sync's{info}", hy, bs, 1.0, False,
                  f"{hy:.3f} vs {bs:.3f}" if hy is not None and bs else "")
        late = get(results, f"wait_cost/{tag}/K:{k}/cora/hybrid", "late_p50_us")
        if late is not None:
            rows.append((f"1 ms waits, K={k}: hybrid late p50 (us, goal <= 25){info}", late / 25.0, 1.0, False,
                         f"{late:.1f} us late (blocking-sync {get(results, f'wait_cost/{tag}/K:{k}/raw_blocking_sync', 'late_p50_us') or 0:.1f}, "
                         f"raw spin {get(results, f'wait_cost/{tag}/K:{k}/raw_spin', 'late_p50_us') or 0:.1f})"))

    # 4. Bandwidth and loading.
    for what, limit in (("copy_h2d", 0.98), ("copy_d2h", 0.98), ("add_f32", 0.97)):
        c = get(results, f"bandwidth/{tag}/{what}/cora", "GB_per_s")
        r = get(results, f"bandwidth/{tag}/{what}/raw", "GB_per_s")
        ratio_row(f"{what} GB/s, cora / raw", c, r, limit, True, f"{c:.1f} vs {r:.1f} GB/s" if c and r else "")
    # Issue 17 on the CPU device: kernels against a plain multithreaded loop, loads against
    # dlopen of the same image. These count as goals on the CPU device too.
    cpu = tag.startswith("cpu")
    for what in ("add_custom_tiling", "reduce_u32"):
        c = get(results, f"bandwidth/{tag}/{what}/cora", "GB_per_s")
        r = get(results, f"bandwidth/{tag}/{what}/raw", "GB_per_s")
        ratio_row(f"{what} GB/s, cora / raw", c, r, 0.9, True,
                  (f"{c:.1f} vs {r:.1f} GB/s" if r else f"{c:.1f} GB/s, no raw row") if c else "")
    if cpu:
        c = get(results, f"bandwidth/{tag}/add_f32/cora", "GB_per_s")
        r = get(results, f"bandwidth/{tag}/add_f32/raw", "GB_per_s")
        ratio_row("add_f32 GB/s, cora / plain threads (CPU goal)", c, r, 0.9, True,
                  f"{c:.1f} vs {r:.1f} GB/s" if c and r else "")
        # The same add with both sides' x, y and z laid out alike (information).
        r1 = get(results, f"bandwidth/{tag}/add_f32/raw_one_buffer", "GB_per_s")
        if r1:
            ratio_row("add_f32 GB/s, cora / plain threads, one allocation each (info)", c, r1, 0.9, True,
                      f"{c:.1f} vs {r1:.1f} GB/s" if c else "")
        c3 = get(results, f"bandwidth/{tag}/add_f32/cora_three_buffers", "GB_per_s")
        if c3:
            ratio_row("add_f32 GB/s, cora / plain threads, three allocations each (info)", c3, r, 0.9, True,
                      f"{c3:.1f} vs {r:.1f} GB/s" if r else "")
    for src in ("file", "memory"):
        c = get(results, f"load/{tag}/{src}/cora", "p50_us")
        r = get(results, f"load/{tag}/{src}/raw", "p50_us")
        # The goal reads the paired row (raw and cora alternately in one loop): the separate
        # rows, run one after the other, drift apart by more than the goal's margin.
        pc = get(results, f"load/{tag}/{src}/paired", "cora_p50_us")
        pr = get(results, f"load/{tag}/{src}/paired", "raw_p50_us")
        if pc is not None and pr:
            ratio_row(f"load_binary from {src}, p50 / raw" + (" dlopen (CPU goal)" if cpu else "") + ", alternately",
                      pc, pr, 1.5 if cpu else 1.2, False, f"{pc:.0f} vs {pr:.0f} us")
            ratio_row(f"load_binary from {src}, p50 / raw, separate rows (info)", c, r,
                      1.5 if cpu else 1.2, False, f"{c:.0f} vs {r:.0f} us" if c and r else "")
        else:
            ratio_row(f"load_binary from {src}, p50 / raw" + (" dlopen (CPU goal)" if cpu else ""), c, r,
                      1.5 if cpu else 1.2, False, f"{c:.0f} vs {r:.0f} us" if c and r else "")
        a = get(results, f"load/{tag}/{src}/raw_unload_away", "p50_us")
        if a:
            ratio_row(f"load_binary from {src}, p50 / raw, unloads on another thread (info)", c, a,
                      1.5 if cpu else 1.2, False, f"{c:.0f} vs {a:.0f} us" if c else "")
    ci = get(results, f"load/{tag}/memory/cora_inline", "p50_us")
    if ci is not None:
        r = get(results, f"load/{tag}/memory/raw", "p50_us")
        ratio_row("load_binary's work without the hop, from memory, p50 / raw (info)", ci, r,
                  1.5 if cpu else 1.2, False, f"{ci:.0f} vs {r:.0f} us" if r else f"{ci:.0f} us")
    jl = get(results, f"load/{tag}/memory/raw_jit_log", "p50_us")
    if jl is not None:
        r = get(results, f"load/{tag}/memory/raw", "p50_us")
        ratio_row("raw load with a JIT error log, p50 / raw without (info)", jl, r, 1.2, False,
                  f"{jl:.0f} vs {r:.0f} us" if r else f"{jl:.0f} us")
    fl = get(results, f"load/{tag}/first_launch/cora", "p50_us")
    fr = get(results, f"load/{tag}/first_launch/raw", "p50_us")
    if fl is not None:
        ratio_row("first launch of a lazily loaded kernel, p50 / raw (info)", fl, fr, 1.2, False,
                  f"{fl:.0f} vs {fr:.0f} us (raw: " + ("dlsym + a direct call" if cpu else "cuModuleGetFunction + first cuLaunchKernel") + ")" if fr
                  else f"{fl:.0f} us")
        e = get(results, f"load/{tag}/{src}/raw_eager", "p50_us")
        if e:
            ratio_row(f"load_binary from {src}, p50 / raw eager load (info)", c, e, 1.2, False,
                      f"{c:.0f} vs {e:.0f} us (every function loaded and described)" if c else "")

    # 5. Resource calls while a kernel runs on another stream (bench/resource_latency): every
    # cora call <= 50 us at p99. The raw driver call beside it is shown for information.
    raw_of = {"alloc": "cuMemAlloc", "free": "cuMemFree", "alloc_host": "cuMemHostAlloc",
              "free_host": "cuMemFreeHost", "make_stream": "cuStreamCreate",
              "destroy_stream": "cuStreamDestroy"}
    for call in ("alloc", "free", "alloc_host", "free_host", "make_stream", "destroy_stream", "event",
                 "drop_binary", "load_binary_call", "copy_4k"):
        p99 = get(results, f"resource/{tag}/{call}/cora", "p99_us")
        if p99 is None:
            continue
        raw = get(results, f"resource/{tag}/{raw_of.get(call, '-')}/raw", "p99_us")
        rows.append((f"{call} while a kernel runs: p99 (us, goal <= 50)", p99 / 50.0, 1.0, False,
                     f"{p99:.1f} us" + (f" (raw {raw_of[call]} {raw:.1f} us)" if raw is not None else "")))
    # The same 4 KiB copy with its await timed: the device round trip and the wait policy's
    # wake-up, which the engine's goals (roundtrip, wait_cost) cover.
    p99 = get(results, f"resource/{tag}/copy_4k_round_trip/cora", "p99_us")
    if p99 is not None:
        p50 = get(results, f"resource/{tag}/copy_4k_round_trip/cora", "p50_us")
        rows.append(("copy_4k with its await, while a kernel runs: p99 / 50 us (info)", p99 / 50.0, 1.0, False,
                     f"{p99:.1f} us (p50 {p50:.1f} us)" if p50 is not None else f"{p99:.1f} us"))

    # 5b. Graphs (bench/graph_bench): a replay against raw cuGraphLaunch of the same graph plus
    # its busy-polled wait (cora with the spin policy, which polls alike; hybrid for
    # information), and against the same chain awaited op by op through cora; K = 1.
    for chain in ("10", "50"):
        r = get(results, f"graph/{tag}/chain:{chain}/raw_graph/K:1", "p50_us")
        c = get(results, f"graph/{tag}/chain:{chain}/cora_graph_spin/K:1", "p50_us")
        ratio_row(f"graph replay p50, {chain}-kernel chain, spin / raw cuGraphLaunch", c, r, 1.05, False,
                  f"{c:.2f} vs {r:.2f} us" if c and r else "")
        h = get(results, f"graph/{tag}/chain:{chain}/cora_graph/K:1", "p50_us")
        ratio_row(f"graph replay p50, {chain}-kernel chain, hybrid / raw (info)", h, r, 1.15, False,
                  f"{h:.2f} vs {r:.2f} us" if h and r else "")
    o = get(results, f"graph/{tag}/chain:10/cora_ops/K:1", "p50_us")
    c = get(results, f"graph/{tag}/chain:10/cora_graph/K:1", "p50_us")
    ratio_row("10-kernel chain p50, op by op / replayed (cora)", o, c, 3.0, True,
              f"{o:.2f} vs {c:.2f} us" if o and c else "")
    for k in ("1", "4"):
        c = get(results, f"graph/{tag}/pipeline/cora_graph/K:{k}", "per_s")
        o = get(results, f"graph/{tag}/pipeline/cora_ops/K:{k}", "per_s")
        ratio_row(f"copy-launch-copy/s, K={k}, graph / ops (info)", c, o, 1.0, True,
                  f"{c:,.0f} vs {o:,.0f}/s" if c and o else "")
    for what in ("instantiate", "set_args", "update"):
        c = get(results, f"graph/{tag}/{what}/cora", "p50_us")
        r = get(results, f"graph/{tag}/{what}/raw", "p50_us")
        ratio_row(f"graph {what} p50 / raw (info)", c, r, 1.2, False, f"{c:.2f} vs {r:.2f} us" if c and r else "")

    # 6. The kernel server (bench/server_load runs on the default device) at 1024 connections.
    if default_device:
        base = "server_load/baseline/connections:1024"
        br, bp = get(results, base, "req_per_s"), get(results, base, "p99_us")
        # Batched: at least 2x the baseline's requests/s; unbatched, with buffers allocated per
        # request from cora's pools, at least the baseline's (issue 21).
        for name, limit, p99_suffix in (("cora_batching", 2.0, ""), ("cora", 1.0, " (info)")):
            r = get(results, f"server_load/{name}/connections:1024", "req_per_s")
            p = get(results, f"server_load/{name}/connections:1024", "p99_us")
            ratio_row(f"server, 1024 conn., {name} req/s / baseline", r, br, limit, True,
                      f"{r:,.0f} vs {br:,.0f} req/s" if r and br else "")
            ratio_row(f"server, 1024 conn., {name} p99 / baseline{p99_suffix}", p, bp, 1.0, False,
                      f"{p / 1000:.1f} vs {bp / 1000:.1f} ms" if p and bp else "")
    return rows


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    folder = argv[1]
    results = load(folder)
    tool = None
    try:
        with open(os.path.join(folder, "cora-roundtrip.json")) as f:
            tool = json.load(f)
    except (OSError, ValueError):
        pass
    everything = {}
    passed = total = 0
    cpu_passed = cpu_total = 0
    tags = devices(results)
    for tag in tags:
        rows = goals_for(results, tag, tool, default_device=tag == tags[0])
        kind = "goals" if tag.startswith("cuda") else "for information (the goals are the GPU's)"
        print(f"\n{tag}: {kind}")
        print(f"  {'goal':<58} {'ratio':>7} {'limit':>7}  {'':<4}  measured")
        for text, ratio, limit, higher, note in rows:
            if ratio is None:
                verdict, shown = "n/a", "-"
            else:
                ok = ratio >= limit if higher else ratio <= limit
                verdict, shown = ("pass" if ok else "MISS"), f"{ratio:.3f}"
                if tag.startswith("cuda") and not any(m in text for m in ("(same goal)", "(cora-roundtrip", "(info)")):
                    total += 1
                    passed += ok
                if "(CPU goal)" in text or (tag.startswith("cpu") and text.startswith(("add_custom_tiling", "reduce_u32"))):
                    cpu_total += 1
                    cpu_passed += ok
            print(f"  {text:<58} {shown:>7} {('>=' if higher else '<=') + format(limit, 'g'):>7}  {verdict:<4}  {note}")
            everything.setdefault(tag, []).append(
                {"goal": text, "ratio": ratio, "limit": limit, "higher_is_better": higher, "note": note})
    if total:
        print(f"\ngoals: {passed}/{total} met on the GPU")
    if cpu_total:
        print(f"CPU-device goals (issue 17): {cpu_passed}/{cpu_total} met")
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
