#!/usr/bin/env python3
"""Side-by-side table of minidl's utilization study (minidl-sweep's results.csv) and one or more
PyTorch runs of bench/pytorch_utilization.py: images/s, the ratio minidl / PyTorch, and peak
allocated / reserved memory per batch size, as Markdown on stdout. Needs only the standard library.

  python3 bench/compare_utilization.py --minidl results/utilization/results.csv \
      --pytorch pt_fp32.csv --pytorch pt_best.csv [--pytorch-label "pytorch fp32" --pytorch-label "pytorch best"] \
      [--steady]
"""
import argparse
import csv
import math
import os
import sys

PROG = "compare_utilization"
PYTORCH_NEEDS = ("batch_size", "images_per_s", "peak_allocated_mib", "peak_reserved_mib", "status")
# run_id tells minidl-sweep's table from the PyTorch script's (the arguments swapped is an easy mistake).
MINIDL_NEEDS = ("run_id",) + PYTORCH_NEEDS


def die(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def number(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class Side:
    """One CSV: rows by batch size, plus what the notes need to know about its configuration."""

    def __init__(self, path, label, needs, minidl):
        self.path, self.label = path, label
        self.rows = {}
        self.warnings = []
        if not os.path.isfile(path):
            die(f"{path}: no such file")
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                die(f"{path}: empty file (no header)")
            missing = [c for c in needs if c not in reader.fieldnames]
            if missing:
                die(f"{path}: missing column(s) {', '.join(missing)}; is it "
                    f"{'a minidl-sweep results.csv' if minidl else 'a bench/pytorch_utilization.py CSV'}?")
            rows = list(reader)
            if not minidl and "run_id" in reader.fieldnames:
                die(f"{path} is a minidl-sweep results.csv; pass it as --minidl")
        if minidl and rows and "study" in rows[0]:
            studies = {r.get("study") for r in rows}
            if studies != {"utilization"}:
                self.warnings.append(f"{path} holds the studies {', '.join(sorted(s or '?' for s in studies))}; "
                                     f"only its 'utilization' rows are used")
                rows = [r for r in rows if r.get("study") == "utilization"]
        for i, r in enumerate(rows, start=2):
            b = number(r.get("batch_size"))
            if b is None or r.get("status") in (None, ""):
                # A torn last line of a killed run, or a hand edit.
                self.warnings.append(f"{path} line {i}: unreadable row skipped")
                continue
            b = int(b)
            if b in self.rows:
                self.warnings.append(f"{path}: batch {b} appears more than once; the last row is used")
            self.rows[b] = r
            if r["status"] not in ("ok", "oom") and r.get("note"):
                self.warnings.append(f"{path}: batch {b} {r['status']}: {r['note']}")
        if not self.rows:
            die(f"{path}: no result rows")

    def field(self, key):
        """The set of values a configuration column takes (empty when the column is absent)."""
        return {r.get(key) for r in self.rows.values() if r.get(key) not in (None, "")}

    def ok(self, b):
        r = self.rows.get(b)
        return r is not None and r["status"] == "ok"

    def largest_ok(self):
        ok = [b for b in self.rows if self.ok(b)]
        return max(ok) if ok else None

    def first_oom(self):
        oom = [b for b, r in self.rows.items() if r["status"] == "oom"]
        return min(oom) if oom else None

    def speed(self, b, column="images_per_s"):
        r = self.rows.get(b)
        if r is None:
            return "missing"
        if r["status"] != "ok":
            return r["status"]
        v = number(r.get(column))
        return f"{v:.1f}" if v is not None else "n/a"

    def memory(self, b):
        r = self.rows.get(b)
        if r is None:
            return "missing"
        if r["status"] != "ok":
            return r["status"]
        a, res = number(r.get("peak_allocated_mib")), number(r.get("peak_reserved_mib"))
        if a is None and res is None:
            rss = number(r.get("peak_rss_mib"))
            # PyTorch on the CPU has no allocator statistics; the process RSS is not the same quantity.
            return f"n/a (process RSS {rss:.0f})" if rss is not None else "n/a"
        return f"{a:.1f} / {res:.1f}" if a is not None and res is not None else f"{a or res:.1f}"


def default_label(side_rows, path, taken):
    def flag(key):
        vals = {r.get(key) for r in side_rows.values()}
        return vals == {"1"}
    parts = ["pytorch"]
    parts.append("amp" if flag("amp") else "fp32")
    if flag("channels_last"):
        parts.append("channels_last")
    if {r.get("cudnn_benchmark") for r in side_rows.values()} == {"0"}:
        parts.append("no-cudnn-benchmark")
    if {r.get("optimizer_impl") for r in side_rows.values()} == {"fused"}:
        parts.append("fused-sgd")
    label = " ".join(parts)
    if label in taken:
        label += f" ({os.path.basename(path)})"
    return label


def describe(side, minidl):
    def one(key):
        v = side.field(key)
        return ", ".join(sorted(v)) if v else "?"
    if minidl:
        return (f"model {one('model')}, {one('image_size')} px, amp {one('amp')}, cudnn_benchmark "
                f"{one('cudnn_benchmark')}, steps {one('steps')}, group {one('group')}")
    return (f"model {one('model')}, {one('image_size')} px, device {one('device')}, torch {one('torch')}, amp "
            f"{one('amp')}, channels_last {one('channels_last')}, cudnn_benchmark {one('cudnn_benchmark')}, "
            f"SGD {one('optimizer_impl')}, steps {one('steps')}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="compare_utilization.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minidl", required=True, help="minidl-sweep --study utilization's results.csv")
    ap.add_argument("--pytorch", action="append", required=True,
                    help="a CSV of bench/pytorch_utilization.py (repeat for several configurations)")
    ap.add_argument("--pytorch-label", action="append", default=[],
                    help="a column label per --pytorch, in the same order (default: from the CSV's settings)")
    ap.add_argument("--busy", action="store_true", help="also show GPU busy %% (gpu_busy_pct) of each side")
    ap.add_argument("--steady", action="store_true",
                    help="also show both sides' images_per_s_steady (the first step left out) and their ratio")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.pytorch_label and len(a.pytorch_label) != len(a.pytorch):
        die(f"{len(a.pytorch_label)} --pytorch-label for {len(a.pytorch)} --pytorch files: give one label per "
            f"file or none")

    m = Side(a.minidl, "minidl", MINIDL_NEEDS, minidl=True)
    pts = []
    for i, p in enumerate(a.pytorch):
        s = Side(p, "", PYTORCH_NEEDS, minidl=False)
        s.label = a.pytorch_label[i] if a.pytorch_label else default_label(s.rows, p, {x.label for x in pts})
        pts.append(s)
    labels = [s.label for s in pts]
    if len(set(labels)) != len(labels):
        die(f"two PyTorch columns have the same label ({', '.join(labels)}); use --pytorch-label")

    notes = list(m.warnings)
    for s in pts:
        notes += s.warnings
        for key in ("model", "image_size"):
            mv, pv = m.field(key), s.field(key)
            if mv and pv and mv != pv:
                notes.append(f"**different {key}**: minidl {', '.join(sorted(mv))}, {s.label} "
                             f"{', '.join(sorted(pv))}: the rows do not measure the same work")
        mv, pv = m.field("steps"), s.field("steps")
        if mv and pv and mv != pv:
            notes.append(f"steps per batch differ: minidl {', '.join(sorted(mv))} (optimizer steps done), "
                         f"{s.label} {', '.join(sorted(pv))}")
        mamp = m.field("amp") == {"on"}
        pamp = s.field("amp") == {"1"}
        if mamp != pamp:
            notes.append(f"precision differs: minidl {'AMP' if mamp else 'fp32'}, {s.label} "
                         f"{'AMP' if pamp else 'fp32'}")
        only_m = sorted(set(m.rows) - set(s.rows))
        only_p = sorted(set(s.rows) - set(m.rows))
        if only_m or only_p:
            parts = ([f"only minidl has {', '.join(map(str, only_m))}"] if only_m else []) + \
                    ([f"only {s.label} has {', '.join(map(str, only_p))}"] if only_p else [])
            notes.append("batch lists differ: " + "; ".join(parts))

    minidl_steady = a.steady and any("images_per_s_steady" in r for r in m.rows.values())
    if a.steady and not minidl_steady:
        notes.append(f"{m.path} has no images_per_s_steady column (written before minidl had one): "
                     f"no steady ratio")

    def ratio(b, s, col):
        mv = number(m.rows[b].get(col)) if m.ok(b) else None
        pv = number(s.rows[b].get(col)) if s.ok(b) else None
        return f"{mv / pv:.2f}x" if mv is not None and pv else ""

    batches = sorted(set(m.rows).union(*[set(s.rows) for s in pts]))
    head = ["batch", "minidl images/s"] + (["minidl steady images/s"] if minidl_steady else [])
    for s in pts:
        head.append(f"{s.label} images/s")
        if a.steady:
            head.append(f"{s.label} steady images/s")
        head.append(f"minidl / {s.label}")
        if minidl_steady:
            head.append(f"minidl / {s.label} steady")
    if a.busy:
        head += ["minidl GPU busy %"] + [f"{s.label} GPU busy %" for s in pts]
    head.append("minidl MiB allocated / reserved")
    head += [f"{s.label} MiB allocated / reserved" for s in pts]

    lines = []
    for b in batches:
        cells = [str(b), m.speed(b)] + ([m.speed(b, "images_per_s_steady")] if minidl_steady else [])
        for s in pts:
            cells.append(s.speed(b))
            if a.steady:
                cells.append(s.speed(b, "images_per_s_steady"))
            cells.append(ratio(b, s, "images_per_s"))
            if minidl_steady:
                cells.append(ratio(b, s, "images_per_s_steady"))
        if a.busy:
            cells += [x.speed(b, "gpu_busy_pct") if "gpu_busy_pct" in next(iter(x.rows.values())) else "n/a"
                      for x in [m] + pts]
        cells.append(m.memory(b))
        cells += [s.memory(b) for s in pts]
        lines.append(cells)

    out = [f"- minidl: `{m.path}` ({describe(m, True)})"]
    out += [f"- {s.label}: `{s.path}` ({describe(s, False)})" for s in pts]
    out.append("")
    out.append("| " + " | ".join(head) + " |")
    out.append("| " + " | ".join("---" for _ in head) + " |")
    out += ["| " + " | ".join(c) + " |" for c in lines]
    out.append("")

    def largest(s):
        v = s.largest_ok()
        return str(v) if v is not None else "none"

    def oom(s):
        v = s.first_oom()
        return f", first out of memory at {v}" if v is not None else ""

    out.append("Largest batch that ran: " + "; ".join(f"{s.label} {largest(s)}{oom(s)}" for s in [m] + pts) + ".")
    out.append("")
    out.append("images/s: all timed steps, the first included, on both sides; steady: the first "
               "step left out (it pays autotuning and handle creation); ratio > 1: minidl faster. "
               "Memory: peak allocated / reserved MiB over the batch's steps.")
    if notes:
        out.append("")
        out.append("Notes:")
        out += [f"- {n}" for n in notes]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
