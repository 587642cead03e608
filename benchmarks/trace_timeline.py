#!/usr/bin/env python3
"""Draws one step of an `amsp train --trace` file as a PNG timeline: for one rank,
the compute track (each unit's forward and backward, the optimizer), the time
compute was blocked waiting, and each communication group's collectives from issue
to completion. Needs matplotlib (Debian: python3-matplotlib).

usage: benchmarks/trace_timeline.py TRACE.json OUT.png [--rank 0] [--step 0]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--step", type=int, default=0, help="which traced step (0: the first)")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in json.load(open(args.trace))["traceEvents"]
              if e.get("ph") == "X" and e["pid"] == args.rank]
    # Steps are separated by the optimizer span on the compute track.
    opt_ends = sorted(e["ts"] + e["dur"] for e in events if e["name"] == "optimizer")
    first = min(e["ts"] for e in events if e["cat"] == "compute")
    start = first if args.step == 0 else opt_ends[args.step - 1]
    end = opt_ends[args.step]
    # The step's compute and waits, and every collective issued during it (the
    # gather-group all-gathers the optimizer issues run into the next step).
    events = [e for e in events if e["ts"] >= start - 1 and
              (e["ts"] + e["dur"] <= end + 1 or (e["cat"].startswith("comm") and e["ts"] <= end))]
    t0 = min(e["ts"] for e in events)
    tracks = sorted({e["cat"] for e in events},
                    key=lambda t: (t != "compute", t != "wait", t))
    colors = {"fwd": "#4c72b0", "bwd": "#dd8452", "optimizer": "#55a868", "wait": "#c44e52"}
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.55 * len(tracks)))
    for y, track in enumerate(tracks):
        for e in events:
            if e["cat"] != track:
                continue
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            key = e["name"].split()[0]
            color = colors.get(key, colors["wait"] if track == "wait" else "#8172b2")
            ax.barh(y, w, left=x, height=0.6, color=color, edgecolor="white", linewidth=0.4)
            if track == "compute" and w > (end - start) / 1e3 / 40:
                ax.text(x + w / 2, y, e["name"].replace("layers.", "L"), ha="center", va="center",
                        fontsize=6, color="white", rotation=90 if w < (end - start) / 1e3 / 15 else 0)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(tracks)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(args.title or f"rank {args.rank}, one training step")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
