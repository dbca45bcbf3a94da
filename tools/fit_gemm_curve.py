#!/usr/bin/env python3
"""Fits a platform's GEMM-efficiency curve (GpuSpec.gemm_efficiency) to measured GEMM times.

The model a curve feeds (platforms/gpu.cpp GpuModel::gemm_time): a GEMM of F FLOP lasts
max(F / (peak x e(F)), bytes / (memory GB/s x memory efficiency)), e interpolated linearly in
log(GFLOP) between the knots and held beyond them; bytes = element size x (mk + kn + mn).

Which measurements: every GEMM below --thin-below GFLOP (0.3), whatever its shape (the only small ones a
benchmark like DeepBench has are thin, as a cold expert's few tokens are), and above it only the
GEMMs whose m and n both reach --min-mn (their tiles fill: a dense layer's or a busy expert's).

Prints, per dtype, the knots reached and the targeted statistic (the median and the largest
|log(model time / measured time)|), before (the --current curve) and after.

  python3 tools/fit_gemm_curve.py tests/data/deepbench-v100-gemm.tsv --peak fp32=15.7 --peak fp16=125 \
      --memory-gbps 900 --memory-efficiency 0.8
"""
import argparse
import math
import statistics

KNOTS = [0.01, 0.134, 0.3, 0.73, 50.0, 200.0]
BYTES = {"fp32": 4, "fp16": 2}


def efficiency(gflops, knots, values):
    x = math.log(gflops)
    pts = [(math.log(k), v) for k, v in zip(knots, values)]
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)


def errors(rows, knots, values, peak, memory):
    out = []
    for flops, nbytes, seconds in rows:
        model = max(flops / (peak * efficiency(flops / 1e9, knots, values)), nbytes / memory)
        out.append(math.log(model / seconds))
    return out


def fit(rows, knots, peak, memory):
    """Coordinate descent on the sum of squared log errors, each knot in [0.005, 0.95]."""
    values = [0.1] * len(knots)
    cost = lambda v: sum(e * e for e in errors(rows, knots, v, peak, memory))
    best = cost(values)
    for _ in range(100):
        for i in range(len(values)):
            for factor in (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 1.01, 1.02, 1.05, 1.1, 1.25, 2.0):
                trial = list(values)
                trial[i] = min(0.95, max(0.005, values[i] * factor))
                if (c := cost(trial)) < best:
                    values, best = trial, c
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", help="TSV: m n k ta tb and a column <dtype>_us per dtype (tests/data/deepbench-v100-gemm.tsv)")
    ap.add_argument("--peak", action="append", required=True, help="dtype=TFLOP/s, e.g. fp16=125")
    ap.add_argument("--memory-gbps", type=float, required=True)
    ap.add_argument("--memory-efficiency", type=float, default=0.8)
    ap.add_argument("--thin-below", type=float, default=0.3, help="GFLOP below which every shape counts")
    ap.add_argument("--min-mn", type=int, default=512, help="above --thin-below, the least m and n counted")
    ap.add_argument("--current", default="0.02,0.12,0.45,0.80,0.90@0.01,0.134,1,10,100",
                    help="the curve to compare with: values@knots")
    args = ap.parse_args()

    lines = [l.rstrip("\n").split("\t") for l in open(args.table) if not l.startswith("#")]
    header, body = lines[0], lines[1:]
    memory = args.memory_gbps * 1e9 * args.memory_efficiency
    cur_values, cur_knots = (list(map(float, s.split(","))) for s in args.current.split("@"))
    for spec in args.peak:
        dtype, tflops = spec.split("=")
        peak = float(tflops) * 1e12
        col = header.index(f"{dtype}_us")
        rows = []
        for r in body:
            m, n, k = int(r[0]), int(r[1]), int(r[2])
            flops = 2.0 * m * n * k
            if flops / 1e9 >= args.thin_below and min(m, n) < args.min_mn:
                continue
            rows.append((flops, BYTES[dtype] * (m * k + k * n + m * n), float(r[col]) * 1e-6))
        values = fit(rows, KNOTS, peak, memory)
        for label, knots, vals in (("current", cur_knots, cur_values), ("fitted", KNOTS, values)):
            err = [abs(e) for e in errors(rows, knots, vals, peak, memory)]
            print(f"{dtype} {label:8s} {len(rows)} GEMMs: "
                  + " ".join(f"{k:g}->{v:.3f}" for k, v in zip(knots, vals))
                  + f"; |log(model/measured)| median {statistics.median(err):.3f}, largest {max(err):.3f}")


if __name__ == "__main__":
    main()
