#!/usr/bin/env python3
"""Medians table of bench/compare.sh runs, and the BENCHMARKS.md section it regenerates.

  table.py RESULTS.jsonl ROUNDS MACHINE    print the markdown section (table + ratios) on stdout
  table.py --replace DOC SECTION.md        put SECTION.md between the results markers of DOC
  table.py --self-test                     check the math and the replacement

Each line of RESULTS.jsonl is one `--json` summary of runnev_bench::publish, tagged by
compare.sh with system (runnev | nats-always | nats-default), mode (plain | seq | frames | open)
and round. A frames run sends `frames` batches per request (Runnev: one request of frames; NATS:
that many async publishes, then their acknowledgements), so its latencies are per request.
Open-loop runs (mode open, `--rate`) get a table of their own: their latencies run from each
publish's scheduled time, so they are not comparable with the closed-loop rows.
"""
import datetime
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


def section(rows, rounds, machine, today=None):
    med = medians(rows)
    today = today or datetime.date.today().isoformat()
    lines = [
        f"## Results ({today}, {rounds} round{'s' if rounds != 1 else ''}, medians; "
        f"`bench/compare.sh {rounds} --update-doc`)",
        "",
        f"Machine: {machine}.",
        "",
        "| system | load | c | runs | msgs/s | MB/s | p50 ms | p90 ms | p99 ms | max ms | client CPU µs/msg | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, c in LOADS:
        for sys_key, label in SYSTEMS:
            m = med.get((sys_key, mode, c))
            if not m:
                continue
            lines.append(
                f"| {label} | {load_label(mode, m)} | {c} | {m['runs']} | {m['msgs_per_sec']:,.0f} | "
                f"{m['mb_per_sec']:.2f} | {m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p99_ms']:.2f} | "
                f"{m['max_ms']:.2f} | {m['cpu_us_per_msg']:.0f} | {m['errors']} |")

    def get(s, mode, c, k):
        return med.get((s, mode, c), {}).get(k, float("nan"))

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
            verdict = "met" if r["p99_ms"] <= OPEN_P99_TARGET_MS else "missed"
            lines += ["", f"Open loop, Runnev p99 {r['p99_ms']:.2f} ms against the target of at most "
                      f"{OPEN_P99_TARGET_MS:g} ms: {verdict}."]

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
        verdict = "met" if frames >= FRAMES_TARGET else "missed"
        lines += [
            "",
            f"{n:.0f} batches per request, c=64 (latencies per request; NATS: {n:.0f} async publishes, "
            "then their acknowledgements, the same publishes in flight): Runnev / NATS sync always = "
            f"**{frames:.2f}×** against the target of at least {FRAMES_TARGET:g}×: {verdict}.",
        ]
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
    elif len(argv) == 4:
        with open(argv[1]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        sys.stdout.write(section(rows, int(argv[2]), argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
