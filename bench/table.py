#!/usr/bin/env python3
"""Medians table of bench/compare.sh runs, and the BENCHMARKS.md section it regenerates.

  table.py RESULTS.jsonl ROUNDS MACHINE [SCALE.jsonl]
                                           print the markdown section (tables, ratios, targets)
  table.py --replace DOC SECTION.md        put SECTION.md between the results markers of DOC
  table.py --self-test                     check the math and the replacement

Each line of RESULTS.jsonl is one `--json` summary of runnev_bench::publish, tagged by
compare.sh with system (runnev | nats-always | nats-default), mode (plain | seq | frames | open)
and round. A frames run sends `frames` batches per request (Runnev: one request of frames; NATS:
that many async publishes, then their acknowledgements), so its latencies are per request.
Open-loop runs (mode open, `--rate`) get a table of their own: their latencies run from each
publish's scheduled time, so they are not comparable with the closed-loop rows. A summary that
carries `server_cpu_secs` (compare.sh adds the servers' user + system time over the run) gets
the server CPU per acknowledged publish.

Each line of SCALE.jsonl is one `--json` summary of another `runnev bench` mode, tagged by
compare.sh with `measure` (streams | catchup | subscribers | disk | failover | restart). With it,
the section ends with every target of the performance issue beside its figure, the peer's where
the peer ran the same load, and the verdict.
"""
import datetime
import functools
import json
import statistics
import sys

START, END = "<!-- results:start -->", "<!-- results:end -->"
SYSTEMS = [
    ("runnev", "Runnev"),
    ("nats-always", "NATS JetStream R3, sync always"),
    ("nats-default", "NATS JetStream R3, default"),
]
MODES = {"plain": "plain", "seq": "with seq", "frames": "frames"}
LOADS = [("plain", 64), ("seq", 64), ("plain", 1), ("frames", 64)]  # row order
FRAMES_TARGET = 3.0  # the target: with many batches per request, at least this × NATS sync always
OPEN_P99_TARGET_MS = 10.0  # the target: open loop at half the measured maximum, p99 at most this
C64_TARGET = 1.5  # c=64 plain: at least this × NATS sync always
C1_TARGET = 1.0  # c=1 p50: at most this × NATS sync always
SERVER_CPU_TARGET_US = 60.0  # c=64 plain: server CPU per publish, summed over three nodes, at most
DISK_TARGET = 1.3  # data directory per byte of retained payload at steady state, at most
FRESH_TARGET_MIB = 30.0  # a fresh three-node cluster on disk, at most
STREAMS_TARGET = 0.9  # 10,000 streams: at least this × the one-stream rate
SUBSCRIBERS_RSS_TARGET_MIB = 512.0  # 1,000 subscribers on one follower: node memory at most
POLL_TARGET_MB = 400.0  # catch-up by polling, at least (MB/s)
SSE_TARGET_MB = 200.0  # catch-up by SSE, at least (MB/s)
FAILOVER_TARGET_MS = 1000.0  # median, at most
RESTART_TARGET_MS = 2000.0  # a 1 GiB node ready after a restart, at most


def medians(rows):
    """{(system, mode, c): {metric: median, "runs": n, "errors": sum}} over the runs."""
    groups = {}
    for r in rows:
        groups.setdefault((r["system"], r["mode"], r["concurrency"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        m = {k: statistics.median(r[k] for r in rs)
             for k in ("msgs_per_sec", "mb_per_sec", "p50_ms", "p90_ms", "p99_ms", "max_ms")}
        # Fields older summaries lack (p99.9, the open loop's rate and schedule).
        for k in ("p999_ms", "rate", "behind_schedule"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            m[k] = statistics.median(vals) if vals else float("nan")
        # Client CPU per acknowledged publish, in µs: the load generator's own cost.
        per_msg = [r["client_cpu_secs"] / r["published"] * 1e6 for r in rs if r["published"]]
        m["cpu_us_per_msg"] = statistics.median(per_msg) if per_msg else float("nan")
        # Server CPU per acknowledged publish, in µs, summed over the system's servers.
        per_msg = [r["server_cpu_secs"] / r["published"] * 1e6 for r in rs
                   if r.get("server_cpu_secs") is not None and r["published"]]
        m["server_cpu_us_per_msg"] = statistics.median(per_msg) if per_msg else float("nan")
        m["frames"] = statistics.median(r.get("frames", 1) for r in rs)
        m["runs"] = len(rs)
        m["errors"] = sum(r["errors"] for r in rs)
        out[key] = m
    return out


def c_open(med, system):
    """The concurrency bound of the system's open-loop runs (one per results file), or None."""
    cs = [c for (s, mode, c) in med if s == system and mode == "open"]
    return cs[0] if cs else None


def load_label(mode, m):
    """The load column: the mode, and for frames how many batches a request carried."""
    if mode == "frames":
        return f"{m['frames']:.0f} per request"
    return MODES[mode]


def ratio(a, b):
    return a / b if b else float("nan")


def metric(med, system, mode, c, k):
    """Median `k` of the system's runs of `mode` at concurrency `c`, NaN when none ran."""
    return med.get((system, mode, c), {}).get(k, float("nan"))


def num(x, fmt, unit=""):
    """x formatted and followed by unit, or a dash when it is NaN (not measured)."""
    return "—" if x != x else format(x, fmt) + unit


def verdict(value, target, at_least):
    """met / missed against the target, or "not measured" when value is NaN."""
    if value != value:
        return "not measured"
    return "met" if (value >= target if at_least else value <= target) else "**missed**"


def scale_figures(scale):
    """The figures of the scale runs (SCALE.jsonl rows), NaN where a run is missing."""
    nan = float("nan")
    f = {k: nan for k in ("streams_ratio", "streams_one", "streams_many", "many_streams", "poll_mb", "sse_mb",
                          "rss_peak_mib", "subscribers", "deliveries", "fresh_mib", "disk_ratio",
                          "fill_mib", "failover_ms", "failover_lost", "restart_ms", "restart_fill_mib")}
    for r in scale:
        m = r.get("measure")
        if m == "streams" and "ratio" in r:
            f.update(streams_ratio=r["ratio"], streams_one=r["one_msgs_per_sec"],
                     streams_many=r["many_msgs_per_sec"], many_streams=r["many_streams"])
        elif m == "catchup" and r.get("method") == "poll":
            f["poll_mb"] = r["mb_per_sec"]
        elif m == "catchup" and r.get("method") == "sse":
            f["sse_mb"] = r["mb_per_sec"]
        elif m == "subscribers":
            f.update(rss_peak_mib=r["rss_peak_kib"] / 1024, subscribers=r["subscribers"],
                     deliveries=r["deliveries_per_sec"])
        elif m == "disk" and r.get("phase") == "fresh":
            f["fresh_mib"] = sum(n["bytes"] for n in r["nodes"]) / 2**20
        elif m == "disk" and r.get("phase") == "snapshotted":
            f.update(disk_ratio=r["bytes_per_payload_byte"], fill_mib=r["payload_bytes"] / 2**20)
        elif m == "failover":
            f.update(failover_ms=r["median_ms"], failover_lost=r["lost"])
        elif m == "restart":
            f.update(restart_ms=r["ready_ms"], restart_fill_mib=r["fill_bytes"] / 2**20)
    return f


def targets_table(med, scale):
    """Every target of the performance issue beside Runnev's figure, the peer's and the verdict."""
    get = functools.partial(metric, med)

    f = scale_figures(scale)
    c64 = ratio(get("runnev", "plain", 64, "msgs_per_sec"), get("nats-always", "plain", 64, "msgs_per_sec"))
    c1 = ratio(get("runnev", "plain", 1, "p50_ms"), get("nats-always", "plain", 1, "p50_ms"))
    frames = ratio(get("runnev", "frames", 64, "msgs_per_sec"), get("nats-always", "frames", 64, "msgs_per_sec"))
    cpu = get("runnev", "plain", 64, "server_cpu_us_per_msg")
    nats_cpu = get("nats-always", "plain", 64, "server_cpu_us_per_msg")
    r_open, n_open = (get(k, "open", c_open(med, k), "p99_ms") for k in ("runnev", "nats-always"))
    rows = [
        ("c=64 plain, msgs/s against NATS sync always", f"≥ {C64_TARGET:g}×", f"{num(c64, '.2f', '×')}",
         f"{num(get('nats-always', 'plain', 64, 'msgs_per_sec'), ',.0f', ' ms')}gs/s", verdict(c64, C64_TARGET, True)),
        ("c=1 p50 against NATS sync always", f"≤ {C1_TARGET:g}×", f"{num(c1, '.2f', '×')}",
         f"{num(get('nats-always', 'plain', 1, 'p50_ms'), '.2f', ' ms')}", verdict(c1, C1_TARGET, False)),
        ("100 per request against NATS sync always (async)", f"≥ {FRAMES_TARGET:g}×", f"{num(frames, '.2f', '×')}",
         f"{num(get('nats-always', 'frames', 64, 'msgs_per_sec'), ',.0f', ' batches/s')}",
         verdict(frames, FRAMES_TARGET, True)),
        ("server CPU per publish at c=64, three nodes", f"≤ {SERVER_CPU_TARGET_US:g} µs", f"{num(cpu, '.0f', ' µs')}",
         f"{num(nats_cpu, '.0f', ' µs')}", verdict(cpu, SERVER_CPU_TARGET_US, False)),
        ("open loop at half the maximum, p99", f"≤ {OPEN_P99_TARGET_MS:g} ms", f"{num(r_open, '.2f', ' ms')}",
         f"{num(n_open, '.2f', ' ms')}", verdict(r_open, OPEN_P99_TARGET_MS, False)),
        (f"data directory per payload byte after {num(f['fill_mib'], '.0f', ' MiB')} and a snapshot cycle, per node",
         f"≤ {DISK_TARGET:g}×", f"{num(f['disk_ratio'], '.2f', '×')}", "", verdict(f["disk_ratio"], DISK_TARGET, False)),
        ("a fresh three-node cluster on disk", f"≤ {FRESH_TARGET_MIB:g} MiB", f"{num(f['fresh_mib'], '.1f', ' MiB')}", "",
         verdict(f["fresh_mib"], FRESH_TARGET_MIB, False)),
        (f"{num(f['many_streams'], ',.0f')} streams against one, msgs/s", f"≥ {STREAMS_TARGET:g}×",
         f"{num(f['streams_ratio'], '.2f', '×')} ({num(f['streams_many'], ',.0f')} against {num(f['streams_one'], ',.0f')})",
         "", verdict(f["streams_ratio"], STREAMS_TARGET, True)),
        (f"{num(f['subscribers'], ',.0f')} SSE subscribers on one follower, its peak memory",
         f"≤ {SUBSCRIBERS_RSS_TARGET_MIB:g} MiB",
         f"{num(f['rss_peak_mib'], '.0f', ' MiB')} ({num(f['deliveries'], ',.0f')} deliveries/s)", "",
         verdict(f["rss_peak_mib"], SUBSCRIBERS_RSS_TARGET_MIB, False)),
        ("catch-up from a follower, polling", f"≥ {POLL_TARGET_MB:g} MB/s", f"{num(f['poll_mb'], '.0f', ' MB/s')}", "",
         verdict(f["poll_mb"], POLL_TARGET_MB, True)),
        ("catch-up from a follower, SSE", f"≥ {SSE_TARGET_MB:g} MB/s", f"{num(f['sse_mb'], '.0f', ' MB/s')}", "",
         verdict(f["sse_mb"], SSE_TARGET_MB, True)),
        ("failover, kill -9 of the leader to the next acknowledged publish, median", f"≤ {FAILOVER_TARGET_MS:g} ms",
         f"{num(f['failover_ms'], '.0f', ' ms')} ({num(f['failover_lost'], '.0f')} lost)", "",
         verdict(f["failover_ms"], FAILOVER_TARGET_MS, False)),
        (f"restart of a node holding {num(f['restart_fill_mib'], '.0f', ' MiB')} after kill -9, ready",
         f"≤ {RESTART_TARGET_MS:g} ms", f"{num(f['restart_ms'], '.0f', ' ms')}", "",
         verdict(f["restart_ms"], RESTART_TARGET_MS, False)),
    ]
    lines = ["", "Targets (the performance issue's, from this run):", "",
             "| measure | target | Runnev | NATS sync always | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return lines


def section(rows, rounds, machine, today=None, scale=None):
    med = medians(rows)
    today = today or datetime.date.today().isoformat()
    lines = [
        f"## Results ({today}, {rounds} round{'s' if rounds != 1 else ''}, medians; "
        f"`bench/compare.sh {rounds} --update-doc`)",
        "",
        f"Machine: {machine}.",
        "",
        "| system | load | c | runs | msgs/s | MB/s | p50 ms | p90 ms | p99 ms | max ms | server CPU µs/msg | client CPU µs/msg | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, c in LOADS:
        for sys_key, label in SYSTEMS:
            m = med.get((sys_key, mode, c))
            if not m:
                continue
            lines.append(
                f"| {label} | {load_label(mode, m)} | {c} | {m['runs']} | {m['msgs_per_sec']:,.0f} | "
                f"{m['mb_per_sec']:.2f} | {m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p99_ms']:.2f} | "
                f"{m['max_ms']:.2f} | {num(m['server_cpu_us_per_msg'], '.0f')} | {m['cpu_us_per_msg']:.0f} | "
                f"{m['errors']} |")

    get = functools.partial(metric, med)

    opens = [(k, label) for k, label in SYSTEMS if (k, "open", c_open(med, k)) in med]
    if opens:
        lines += [
            "",
            "Open loop (`--rate`: publishes started on a fixed schedule, latency from each one's "
            "scheduled time, no coordinated omission; HdrHistogram percentiles): each round at half "
            "of Runnev's c=64 plain maximum measured last before it, the same rate for both systems.",
            "",
            "| system | rate batches/s | most in flight | runs | msgs/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | sends behind schedule | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k, label in opens:
            c = c_open(med, k)
            m = med[(k, "open", c)]
            lines.append(
                f"| {label} | {m['rate']:,.0f} | {c} | {m['runs']} | {m['msgs_per_sec']:,.0f} | "
                f"{m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p99_ms']:.2f} | {m['p999_ms']:.2f} | "
                f"{m['max_ms']:.2f} | {m['behind_schedule']:,.0f} | {m['errors']} |")
        r = med.get(("runnev", "open", c_open(med, "runnev")))
        if r:
            said = "met" if r["p99_ms"] <= OPEN_P99_TARGET_MS else "missed"
            lines += ["", f"Open loop, Runnev p99 {r['p99_ms']:.2f} ms against the target of at most "
                      f"{OPEN_P99_TARGET_MS:g} ms: {said}."]

    lines += [
        "",
        "Ratios of medians: c=64 plain, Runnev / NATS sync always = "
        f"**{ratio(get('runnev', 'plain', 64, 'msgs_per_sec'), get('nats-always', 'plain', 64, 'msgs_per_sec')):.2f}×**; "
        f"/ NATS default = {ratio(get('runnev', 'plain', 64, 'msgs_per_sec'), get('nats-default', 'plain', 64, 'msgs_per_sec')):.2f}×. "
        "c=64 with seq, Runnev / NATS sync always = "
        f"{ratio(get('runnev', 'seq', 64, 'msgs_per_sec'), get('nats-always', 'seq', 64, 'msgs_per_sec')):.2f}×. "
        "c=1 p50, Runnev / NATS sync always = "
        f"{ratio(get('runnev', 'plain', 1, 'p50_ms'), get('nats-always', 'plain', 1, 'p50_ms')):.2f}× "
        "(above 1: Runnev is slower).",
    ]
    frames = ratio(get('runnev', 'frames', 64, 'msgs_per_sec'), get('nats-always', 'frames', 64, 'msgs_per_sec'))
    if frames == frames:  # not NaN: both ran
        n = get('runnev', 'frames', 64, 'frames')
        said = "met" if frames >= FRAMES_TARGET else "missed"
        lines += [
            "",
            f"{n:.0f} batches per request, c=64 (latencies per request; NATS: {n:.0f} async publishes, "
            "then their acknowledgements, the same publishes in flight): Runnev / NATS sync always = "
            f"**{frames:.2f}×** against the target of at least {FRAMES_TARGET:g}×: {said}.",
        ]
    if scale is not None:
        lines += targets_table(med, scale)
    return "\n".join(lines) + "\n"


def replace(doc_text, new_section):
    """doc_text with the text between the markers replaced by new_section (markers kept)."""
    i, j = doc_text.find(START), doc_text.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"the document has no {START} ... {END} section")
    return doc_text[: i + len(START)] + "\n" + new_section.rstrip("\n") + "\n" + doc_text[j:]


def self_test():
    def row(system, mode, c, mps, p50, cpu=1.0, published=1000, errors=0):
        return {"system": system, "mode": mode, "concurrency": c, "msgs_per_sec": mps,
                "mb_per_sec": mps * 1024 / 1e6, "p50_ms": p50, "p90_ms": p50, "p99_ms": p50,
                "max_ms": p50, "client_cpu_secs": cpu, "published": published, "errors": errors}

    rows = [row("runnev", "plain", 64, m, 10) for m in (100, 300, 200)]
    rows += [row("nats-always", "plain", 64, 400, 5, errors=2), row("nats-default", "plain", 64, 800, 3)]
    rows += [row("runnev", "plain", 1, 50, 2.0), row("nats-always", "plain", 1, 90, 1.0)]
    framed = [dict(row("runnev", "frames", 64, 900, 50), frames=100), dict(row("nats-always", "frames", 64, 400, 20), frames=100)]
    opens = [dict(row("runnev", "open", 256, 100, p99), rate=100.0, p999_ms=p99 * 2, behind_schedule=b)
             for p99, b in ((4.0, 0), (12.0, 3), (8.0, 1))]
    opens.append(dict(row("nats-always", "open", 256, 100, 3.0), rate=100.0, p999_ms=5.0, behind_schedule=0))
    med = medians(rows)
    assert med[("runnev", "plain", 64)]["msgs_per_sec"] == 200, med
    assert med[("runnev", "plain", 64)]["runs"] == 3
    assert med[("runnev", "plain", 64)]["cpu_us_per_msg"] == 1000.0
    assert med[("nats-always", "plain", 64)]["errors"] == 2
    text = section(rows, 3, "test box", today="2000-01-01")
    assert "Open loop" not in text, "no open-loop table without open-loop runs"
    assert "batches per request" not in text, "no frames ratio without frames runs"
    text = section(rows + framed, 3, "test box", today="2000-01-01")
    assert "| Runnev | 100 per request | 64 | 1 | 900 |" in text, text
    assert "Runnev / NATS sync always = **2.25×** against the target of at least 3×: missed." in text, text
    assert text.index("| Runnev | plain | 1 |") < text.index("| Runnev | 100 per request |"), "frames rows last"
    assert med[("runnev", "plain", 64)]["p999_ms"] != med[("runnev", "plain", 64)]["p999_ms"], "NaN when absent"
    text = section(rows + opens, 3, "test box", today="2000-01-01")
    assert "| Runnev | 100 | 256 | 3 | 100 | 8.00 | 8.00 | 8.00 | 16.00 | 8.00 | 1 | 0 |" in text, text
    assert "| NATS JetStream R3, sync always | 100 | 256 | 1 |" in text, text
    assert "Runnev p99 8.00 ms against the target of at most 10 ms: met." in text, text
    assert text.index("| Runnev | plain | 64 |") < text.index("Open loop"), "closed-loop table first"
    assert "**0.50×**" in text and "/ NATS default = 0.25×" in text, text
    assert "c=1 p50, Runnev / NATS sync always = 2.00×" in text, text
    assert "| Runnev | plain | 64 | 3 | 200 |" in text, text
    assert "| — | 1000 | 0 |" in text, "a dash for the server CPU of a run that did not measure it"
    assert "Targets" not in text, "no targets table without the scale runs"
    cpu_rows = [dict(row("runnev", "plain", 64, 200, 10, published=1000), server_cpu_secs=s) for s in (0.05, 0.07, 0.09)]
    scale = [
        {"measure": "streams", "ratio": 0.95, "one_msgs_per_sec": 200.0, "many_msgs_per_sec": 190.0, "many_streams": 10000},
        {"measure": "streams", "mode": "streams", "msgs_per_sec": 1.0},  # a per-run line, no ratio: ignored
        {"measure": "catchup", "method": "poll", "mb_per_sec": 350.0},
        {"measure": "catchup", "method": "sse", "mb_per_sec": 500.0},
        {"measure": "subscribers", "rss_peak_kib": 300 * 1024, "subscribers": 1000, "deliveries_per_sec": 1e5},
        {"measure": "disk", "phase": "fresh", "nodes": [{"bytes": 5 * 2**20}] * 3},
        {"measure": "disk", "phase": "snapshotted", "bytes_per_payload_byte": 1.2, "payload_bytes": 2**30},
        {"measure": "failover", "median_ms": 700.0, "lost": 0},
    ]
    text = section(rows + cpu_rows + opens, 3, "test box", today="2000-01-01", scale=scale)
    assert "| Runnev | plain | 64 | 6 | 200 | 0.20 | 10.00 | 10.00 | 10.00 | 10.00 | 70 | 1000 | 0 |" in text, text
    assert "| server CPU per publish at c=64, three nodes | ≤ 60 µs | 70 µs | — | **missed** |" in text, text
    assert "| c=64 plain, msgs/s against NATS sync always | ≥ 1.5× | 0.50× | 400 msgs/s | **missed** |" in text, text
    assert "| c=1 p50 against NATS sync always | ≤ 1× | 2.00× | 1.00 ms | **missed** |" in text, text
    assert "| open loop at half the maximum, p99 | ≤ 10 ms | 8.00 ms | 3.00 ms | met |" in text, text
    assert "| data directory per payload byte after 1024 MiB and a snapshot cycle, per node | ≤ 1.3× | 1.20× |  | met |" in text, text
    assert "| a fresh three-node cluster on disk | ≤ 30 MiB | 15.0 MiB |  | met |" in text, text
    assert "| 10,000 streams against one, msgs/s | ≥ 0.9× | 0.95× (190 against 200) |  | met |" in text, text
    assert "| catch-up from a follower, polling | ≥ 400 MB/s | 350 MB/s |  | **missed** |" in text, text
    assert "| catch-up from a follower, SSE | ≥ 200 MB/s | 500 MB/s |  | met |" in text, text
    assert "| 1,000 SSE subscribers on one follower, its peak memory | ≤ 512 MiB | 300 MiB (100,000 deliveries/s) |  | met |" in text, text
    assert "| failover, kill -9 of the leader to the next acknowledged publish, median | ≤ 1000 ms | 700 ms (0 lost) |  | met |" in text, text
    assert "| restart of a node holding — after kill -9, ready | ≤ 2000 ms | — |  | not measured |" in text, text
    assert "| 100 per request against NATS sync always (async) | ≥ 3× | — | — | not measured |" in text, text
    doc = f"# B\n\nintro\n{START}\nold table\n{END}\nafter\n"
    new = replace(doc, "NEW\n")
    assert new == f"# B\n\nintro\n{START}\nNEW\n{END}\nafter\n", new
    assert replace(new, "NEW\n") == new, "replacing twice changes nothing"
    try:
        replace("no markers", "x")
        raise AssertionError("missing markers must fail")
    except SystemExit:
        pass
    print("table.py self-test ok")


def main(argv):
    if argv[1:] == ["--self-test"]:
        self_test()
    elif len(argv) == 4 and argv[1] == "--replace":
        doc, sec = argv[2], argv[3]
        with open(doc) as f:
            text = f.read()
        with open(sec) as f:
            new = replace(text, f.read())
        with open(doc, "w") as f:
            f.write(new)
    elif len(argv) in (4, 5):
        with open(argv[1]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        scale = None
        if len(argv) == 5:
            with open(argv[4]) as f:
                scale = [json.loads(line) for line in f if line.strip()]
        sys.stdout.write(section(rows, int(argv[2]), argv[3], scale=scale))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
