#!/usr/bin/env python3
"""Reads quire-bench's JSON lines, prints the comparison table (each figure as a ratio to the
best peer) and draws p99 delivery latency against offered load as an SVG; with presence
results, also server CPU per presence change against clients (bench-presence.svg beside it),
and tables of the large document's memory, the many-items document and content reads.
Usage: report.py results.jsonl plot.svg"""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
servers = ["quire", "floor", "y-websocket", "hocuspocus"]
# The floor (bench/src/floor.rs) is shown beside the peers but is not one of them: it is the
# limit, not a server anyone runs.
peers = ["y-websocket", "hocuspocus"]


def pick(label, scenario, **match):
    for r in rows:
        if r.get("label") == label and r.get("scenario") == scenario and all(
            r.get(k) == v for k, v in match.items()
        ):
            return r
    return None


def fig(name, better, getter):
    vals = {s: getter(s) for s in servers}
    peer_vals = [v for p, v in vals.items() if p in peers and isinstance(v, (int, float))]
    q = vals["quire"]
    ratio = ""
    if peer_vals and isinstance(q, (int, float)):
        best = min(peer_vals) if better == "lower" else max(peer_vals)
        if best:
            ratio = f"{q / best:.2f}x"
    return name, vals, ratio, better


def fmt(v):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 100 else f"{v:,.0f}"
    return str(v)


table = []
# The typing run without acks is the same load for every server; Quire's run with a durable-ack
# request after every update is reported beside it.
plain = lambda s: pick(s, "typing", rooms=200, rate=5.0, ack_p99_ms=None) or {}
acked = lambda s: next((r for r in rows if r.get("label") == s and r.get("scenario") == "typing"
                        and r.get("rooms") == 200 and r.get("ack_p99_ms") is not None), {})
table.append(fig("server CPU s per 1,000 updates (200 rooms x 4 clients x 5/s)", "lower",
                 lambda s: plain(s).get("server_cpu_per_1k")))
table.append(fig("delivery p99 ms (200 x 4 x 5/s)", "lower",
                 lambda s: plain(s).get("p99_ms")))
table.append(fig("all delivered (200 x 4 x 5/s)", "higher",
                 lambda s: plain(s).get("complete")))
table.append(fig("... with a durable-ack request per update: server CPU s per 1,000", "lower",
                 lambda s: acked(s).get("server_cpu_per_1k")))
table.append(fig("... durable ack p99 ms at 4,000 updates/s", "lower",
                 lambda s: acked(s).get("ack_p99_ms")))
for n in (10, 50, 200):
    table.append(fig(f"fan-out to {n} readers, p99 ms", "lower",
                     lambda s, n=n: (pick(s, "typing", rooms=1, clients=n + 1) or {}).get("p99_ms")))
table.append(fig("highest rate with p99 < 50 ms (updates/s in)", "higher",
                 lambda s: (pick(s, "search") or {}).get("best_rate_per_s")))
for n in (2000, 5000, 10000):
    table.append(fig(f"RSS KiB per idle connection at {n}", "lower",
                     lambda s, n=n: (pick(s, "idle", conns=n) or {}).get("kib_per_conn")))
    table.append(fig(f"time to connect {n} (s)", "lower",
                     lambda s, n=n: (pick(s, "idle", conns=n) or {}).get("connect_s")))
table.append(fig("editing-trace ingest, updates/s", "higher",
                 lambda s: (pick(s, "coldload-ingest") or {}).get("updates_per_s")))
table.append(fig("new client synced to the trace after restart, ms", "lower",
                 lambda s: (pick(s, "coldload-verify") or {}).get("sync_ms")))
table.append(fig("... with the right text", "higher",
                 lambda s: (pick(s, "coldload-verify") or {}).get("text_ok")))
table.append(fig("server RSS MiB with the trace document loaded", "lower",
                 lambda s: ((pick(s, "coldload-verify") or {}).get("server_rss_kib") or 0) / 1024 or None))

print("| figure | " + " | ".join(servers) + " | Quire vs best peer |")
print("|---|" + "---|" * len(servers) + "---|")
for name, vals, ratio, better in table:
    note = f"{ratio} ({better} is better)" if ratio else ""
    print(f"| {name} | " + " | ".join(fmt(vals[s]) for s in servers) + f" | {note} |")

# The Hocuspocus protocol: Quire's /hocuspocus endpoint against the Hocuspocus server, the same
# load in the same flavour.
hp_rows = [
    ("server CPU s per 1,000 updates (200 rooms x 4 clients x 5/s)",
     lambda s: (pick(s, "typing", rooms=200, rate=5.0) or {}).get("server_cpu_per_1k")),
    ("delivery p99 ms (200 x 4 x 5/s)",
     lambda s: (pick(s, "typing", rooms=200, rate=5.0) or {}).get("p99_ms")),
    ("all delivered (200 x 4 x 5/s)",
     lambda s: (pick(s, "typing", rooms=200, rate=5.0) or {}).get("complete")),
] + [
    (f"fan-out to {n} readers, p99 ms",
     lambda s, n=n: (pick(s, "typing", rooms=1, clients=n + 1) or {}).get("p99_ms"))
    for n in (10, 50, 200)
]
if pick("quire-hocuspocus", "typing"):
    print()
    print("| Hocuspocus protocol | quire /hocuspocus | hocuspocus | Quire vs Hocuspocus |")
    print("|---|---|---|---|")
    for name, get in hp_rows:
        q, h = get("quire-hocuspocus"), get("hocuspocus")
        ratio = f"{q / h:.2f}x" if isinstance(q, (int, float)) and not isinstance(q, bool) and h else ""
        print(f"| {name} | {fmt(q)} | {fmt(h)} | {ratio} |")

# Round two: CPU per update at three loads against the floor, the join storm, large documents.
two = ["floor", "quire", "quire-normal", "y-websocket", "hocuspocus"]
loads = [("light", 200, 1.0), ("medium", 100, 3.0), ("heavy", 200, 5.0)]


def load_row(s, rooms, rate):
    return next((r for r in rows if r.get("label") == s and r.get("scenario") == "typing"
                 and r.get("rooms") == rooms and r.get("rate") == rate and r.get("clients") == 4
                 and r.get("ack_p99_ms") is None), {})


def ratio(a, b):
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return f"{a / b:.2f}x" if ok and b else ""


print()
print("| round two | " + " | ".join(two) + " | Quire vs y-websocket | normal vs floor |")
print("|---|" + "---|" * len(two) + "---|---|")
for name, rooms, rate in loads:
    for what, key, unit in (("server CPU µs per update", "server_cpu_per_1k", 1000),
                            ("delivery p99 ms", "p99_ms", 1)):
        vals = {s: load_row(s, rooms, rate).get(key) for s in two}
        vals = {s: (v * unit if isinstance(v, (int, float)) else v) for s, v in vals.items()}
        label = f"{what}, {name} ({rooms} x 4 x {rate:g}/s)"
        print(f"| {label} | " + " | ".join(fmt(vals[s]) for s in two)
              + f" | {ratio(vals['quire'], vals['y-websocket'])}"
              + f" | {ratio(vals['quire-normal'], vals['floor']) if key == 'server_cpu_per_1k' else ''} |")
storm = lambda s: pick(s, "storm", uploaded=True) or {}
for what, get in (
    ("join storm p50 ms", lambda s: storm(s).get("p50_ms")),
    ("join storm p99 ms", lambda s: storm(s).get("p99_ms")),
    ("join storm: peak RSS above the loaded document, MiB",
     lambda s: (storm(s)["peak_rss_kib"] - storm(s)["rss_before_kib"]) / 1024
     if storm(s).get("peak_rss_kib") and storm(s).get("rss_before_kib") else None),
    ("RSS with the large document loaded / its encoded size",
     lambda s: (storm(s)["rss_before_kib"] - storm(s)["rss_fresh_kib"]) * 1024 / storm(s)["doc_bytes"]
     if storm(s).get("rss_before_kib") and storm(s).get("rss_fresh_kib") else None),
    ("4 clients typing into the large document, delivery p99 ms",
     lambda s: (pick(s, "typing", rooms=1, clients=4) or {}).get("p99_ms")),
):
    vals = {s: get(s) for s in two}
    print(f"| {what} | " + " | ".join(fmt(vals[s]) for s in two)
          + f" | {ratio(vals['quire'], vals['y-websocket'])} | |")
one_core = {s: (pick(f"{s}-1core", "search") or {}).get("best_rate_per_s") for s in two}
if any(one_core.values()):
    best = max([v for s, v in one_core.items() if s in peers and v] or [0])
    print(f"| highest rate with p99 < 50 ms, each server on one core (updates/s) | "
          + " | ".join(fmt(one_core[s]) for s in two)
          + f" | {ratio(one_core['quire'], best) if best else ''} (vs best peer) | |")
snap = pick("quire-snapshots", "typing") or {}
restart = pick("quire-restart", "storm") or {}
if snap or restart:
    print()
    print(f"Quire, large document with a snapshot every 50 updates: delivery p99 {fmt(snap.get('p99_ms'))} ms, "
          f"max {fmt(snap.get('max_ms'))} ms; first client after a restart synced in "
          f"{fmt(restart.get('p50_ms'))} ms")

# Nodes under the same CPU quota (bench/nodes.sh).
# (The latest run of each configuration: bench/nodes.sh may be run again for some.)
nodes = {(n, how): next((r.get("best_rate_per_s") for r in reversed(rows)
                         if r.get("label") == f"nodes{n}-{how}" and r.get("scenario") == "search"),
                        None)
         for n in (1, 2, 3) for how in ("by-document", "spread")}
if any(nodes.values()):
    one = nodes[(1, "by-document")]
    print()
    print("| nodes (same CPU quota each) | clients of a document on one node | spread over nodes |")
    print("|---|---|---|")
    for n in (1, 2, 3):
        cells = []
        for how in ("by-document", "spread"):
            v = nodes[(n, how)]
            cells.append(f"{fmt(v)} ({ratio(v, one)})" if v and one else fmt(v))
        print(f"| {n} | " + " | ".join(cells) + " |")

# The same with a smaller quota (bench/nodes.sh 0.25), which leaves the machine room for the
# generator, PostgreSQL and NATS.
small = {n: next((r.get("best_rate_per_s") for r in reversed(rows)
                  if r.get("label") == f"nodes{n}-by-document-q0.25" and r.get("scenario") == "search"),
                 None)
         for n in (1, 3)}
if small[1] and small[3]:
    print()
    print(f"nodes at 0.25 core each, by document: 1 node {fmt(small[1])}, 3 nodes {fmt(small[3])} "
          f"({ratio(small[3], small[1])})")

# Relayed scale-out (issue 36, target 4): spread clients against clients by document under the
# same quota, as the highest rate with p99 < 50 ms and as the nodes' CPU per update at a fixed
# rate (the latest run of each).
def latest(label, scenario, key):
    return next((r.get(key) for r in reversed(rows)
                 if r.get("label") == label and r.get("scenario") == scenario), None)
spread_rows = []
for suffix, quota in (("-q0.25", "0.25"), ("", "0.4")):
    for n in (2, 3):
        doc, spr = (latest(f"nodes{n}-{how}{suffix}", "search", "best_rate_per_s")
                    for how in ("by-document", "spread"))
        cdoc, cspr = (latest(f"nodes{n}-{how}{suffix}", "nodes-cpu", "cpu_us_per_update")
                      for how in ("by-document", "spread"))
        if doc and spr:
            spread_rows.append(f"| {quota} | {n} | {fmt(doc)} | {fmt(spr)} ({spr / doc:.0%}) | "
                               f"{fmt(cdoc)} | {fmt(cspr)} ({ratio(cspr, cdoc)}) |")
if spread_rows:
    print()
    print("| quota (core per node) | nodes | by document, updates/s | spread | by document, CPU µs per update | spread |")
    print("|---|---|---|---|---|---|")
    print("\n".join(spread_rows))

# Plot: p99 against offered load, from the search steps.
W, H, L, B = 640, 400, 60, 50
colors = {"quire": "#1f77b4", "floor": "#7f7f7f", "y-websocket": "#ff7f0e", "hocuspocus": "#2ca02c"}
pts = {s: [(r["offered_per_s"], r["p99_ms"]) for r in rows
           if r.get("label") == s and r.get("scenario") == "search-step"] for s in servers}
xmax = max([x for p in pts.values() for x, _ in p] + [1])
ymax = min(max([y for p in pts.values() for _, y in p] + [1]), 500)
sx = lambda x: L + (W - L - 20) * x / xmax
sy = lambda y: H - B - (H - B - 20) * min(y, ymax) / ymax
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
       f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
       f'<text x="{(W+L)/2}" y="{H-12}" text-anchor="middle">offered load (updates/s in, 50 rooms x 4 clients)</text>',
       f'<text x="16" y="{(H-B)/2}" transform="rotate(-90 16 {(H-B)/2})" text-anchor="middle">p99 delivery latency (ms)</text>',
       f'<line x1="{L}" y1="{sy(50)}" x2="{W-20}" y2="{sy(50)}" stroke="#999" stroke-dasharray="4"/>',
       f'<text x="{W-22}" y="{sy(50)-4}" text-anchor="end" fill="#666">50 ms</text>']
for i in range(5):
    x = xmax * i / 4
    y = ymax * i / 4
    svg.append(f'<text x="{sx(x)}" y="{H-B+16}" text-anchor="middle">{x:,.0f}</text>')
    svg.append(f'<text x="{L-6}" y="{sy(y)+4}" text-anchor="end">{y:.0f}</text>')
for k, (s, p) in enumerate(pts.items()):
    if not p:
        continue
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(p))
    svg.append(f'<polyline fill="none" stroke="{colors[s]}" stroke-width="2" points="{path}"/>')
    for x, y in p:
        svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colors[s]}"/>')
    svg.append(f'<text x="{L+10}" y="{30+16*k}" fill="{colors[s]}">{s}</text>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg) + "\n")
print(f"\nplot written to {sys.argv[2]}")

# Round three: presence at scale, a large document's memory, content reads.
presence = [r for r in rows if r.get("scenario") == "presence"]
if presence:
    sizes = sorted({r["clients"] for r in presence})
    labels = [s for s in ("floor", "quire", "y-websocket", "hocuspocus")
              if any(r["label"] == s for r in presence)]
    at = lambda s, n: next((r for r in presence if r["label"] == s and r["clients"] == n), {})
    print()
    print("| presence: µs of server CPU per change (delivery p99 ms) | " + " | ".join(labels)
          + " | Quire vs floor |")
    print("|---|" + "---|" * len(labels) + "---|")
    for n in sizes:
        cells = []
        for s in labels:
            r = at(s, n)
            cpu = r.get("server_us_per_change")
            cells.append(f"{fmt(cpu)} ({fmt(r.get('p99_ms'))})" if cpu is not None else "")
        print(f"| {n} clients at 1/s | " + " | ".join(cells)
              + f" | {ratio(at('quire', n).get('server_us_per_change'), at('floor', n).get('server_us_per_change'))} |")
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), "bench-presence.svg")
    W, H, L, B = 640, 360, 70, 40
    top = max(r.get("server_us_per_change") or 0 for r in presence) or 1
    xs = (min(sizes), max(sizes)) if len(sizes) > 1 else (0, sizes[0] or 1)
    sx = lambda x: L + (x - xs[0]) / ((xs[1] - xs[0]) or 1) * (W - L - 20)
    sy = lambda y: H - B - y / top * (H - B - 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{W/2}" y="14" text-anchor="middle">server CPU per presence change (µs) against clients in one document, 1 change/s each</text>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>']
    for n in sizes:
        out.append(f'<text x="{sx(n):.1f}" y="{H-B+16}" text-anchor="middle">{n:,}</text>')
    for k in range(5):
        y = top * k / 4
        out.append(f'<text x="{L-6}" y="{sy(y)+4:.1f}" text-anchor="end">{y:,.0f}</text>')
    palette = {"floor": "#888888", "quire": "#1f77b4", "y-websocket": "#d62728", "hocuspocus": "#2ca02c"}
    for k, s in enumerate(labels):
        pts = [(n, at(s, n).get("server_us_per_change")) for n in sizes]
        pts = [(x, y) for x, y in pts if y is not None]
        out.append(f'<polyline fill="none" stroke="{palette[s]}" stroke-width="2" points="'
                   + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts) + '"/>')
        out.append(f'<text x="{W-150}" y="{40+16*k}" fill="{palette[s]}">{s}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")
    print(f"presence plot written to {path}")
# The large document's rows (bench/memory.sh); the many-items rows (bench/items.sh) carry
# the document's item count and get a table of their own.
memory = [r for r in rows if r.get("scenario") == "memory" and r.get("items") is None]
if memory:
    import statistics
    print()
    print("| large document RSS, MB (median of runs) | loaded | after a join storm | after typing |")
    print("|---|---|---|---|")
    for s in sorted({r["label"] for r in memory}):
        got = [r for r in memory if r["label"] == s]
        med = lambda k: statistics.median([r[k] for r in got if r.get(k) is not None] or [0])
        print(f"| {s} | {med('rss_loaded_mb'):.0f} | {med('rss_after_storm_mb'):.0f} | {med('rss_after_typing_mb'):.0f} |")
items = [r for r in rows if r.get("scenario") == "memory" and r.get("items") is not None]
if items:
    print()
    print("| many items (latest run) | items | upload ms | first client's open ms | RSS loaded MB "
          "| storm peak MB | after typing MB |")
    print("|---|---|---|---|---|---|---|")
    latest_of = {r["label"]: r for r in items}
    for s, r in latest_of.items():
        print(f"| {s} | {r.get('items'):,} | {fmt(r.get('upload_ms'))} | {fmt(r.get('open_ms'))} "
              f"| {fmt(r.get('rss_loaded_mb'))} | {fmt(r.get('storm_peak_mb'))} "
              f"| {fmt(r.get('rss_after_typing_mb'))} |")
    compact = [r for r in rows if r.get("scenario") == "compact"]
    if compact:
        print(f"quire compact of that document after a kill: {fmt(compact[-1].get('compact_ms'))} ms")
reads = [r for r in rows if r.get("scenario") == "reads"]
if reads:
    print()
    print("| content reads (Quire) | first read ms | first read CPU ms | again: CPU ms per read |")
    print("|---|---|---|---|")
    for r in reads:
        print(f"| {r['read']} | {fmt(r.get('first_ms'))} | {fmt(r.get('first_cpu_ms'))} | {fmt(r.get('repeat_cpu_ms_per_read'))} |")
