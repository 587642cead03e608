#!/usr/bin/env python3
"""Plots `amsp plan --sweep`: predicted MFU against GPUs, one line per system.

usage: plot_sweep.py SWEEP.json OUT.png

`amsp plan --sweep ... --plot OUT.png` runs this with the JSON that `--json` prints
(written to a temporary file). A system that does not fit memory or is invalid at a
scale has no point there. Exit codes: 0 written; 1 bad input; 2 matplotlib missing.
"""
import json
import sys

PROG = "plot_sweep.py"


def main(argv):
    if len(argv) != 3:
        print(f"{PROG}: usage: {PROG} SWEEP.json OUT.png", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator, PercentFormatter
    except ImportError as e:
        print(f"{PROG}: {e}; install it: apt-get install python3-matplotlib", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            data = json.load(f)
        inp, systems, scales = data["input"], data["systems"], data["scales"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{PROG}: {argv[1]}: {e!r}; expected the JSON of amsp plan --sweep --json",
              file=sys.stderr)
        return 1

    gpus = [s["gpus"] for s in scales]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    markers = "osD^vx*+"
    for i, system in enumerate(systems):
        xs, ys = [], []
        for s in scales:
            point = s["systems"][system["id"]]
            if point["status"] == "ok" and point["mfu"] is not None:
                xs.append(s["gpus"])
                ys.append(100 * point["mfu"])
        if xs:
            ax.plot(xs, ys, marker=markers[i % len(markers)], label=system["label"])
        else:  # keep it in the legend: "does not fit anywhere" is a result too
            ax.plot([], [], marker=markers[i % len(markers)], label=f"{system['label']} (OOM)")

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(gpus))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(g) for g in gpus])
    if len(gpus) == 1:
        ax.set_xlim(gpus[0] / 1.5, gpus[0] * 1.5)
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter())
    ax.set_xlabel("GPUs")
    ax.set_ylabel("MFU (predicted)")
    batch = inp["global_batch"]
    title = (f"{inp['model']} on {inp['cluster']} ({inp['gpus_per_node']} GPUs per node), "
             f"seq {inp['seq_len']}, {inp['precision']}")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    first = scales[0] if scales else None
    batch_text = (f"global batch {first['global_batch_tokens']:,} tokens at every scale"
                  if first and batch == "fixed" else "one micro-batch per rank")
    note = (f"predicted by amsp's cost model (cluster table {inp['bandwidth_kind']}); "
            f"{batch_text}")
    fig.text(0.01, 0.01, note, fontsize=8, ha="left", va="bottom", color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    try:
        fig.savefig(argv[2], format="png")
    except OSError as e:
        print(f"{PROG}: {argv[2]}: {e.strerror or e}; expected a writable PNG path",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
