#!/usr/bin/env python3
"""Writes a gating trace (moesim's CSV) in which every GPU routes its tokens alike.

One source row per iteration; replayed on G GPUs, every GPU replays it (docs/gating.md, "Replay onto a
cluster"), so every message to an expert has the same size. Each row is the expected routing of
`tokens` tokens, top-k, under Zipf(s) popularity over a seeded permutation of the experts (s = 0:
uniform), rounded by largest remainder so that it sums to tokens * k.

Why: per-pair simulation (sim.aggregate=false) of a sampled routing makes every GPU pair's
message a distinct size, so every flow ends at its own event; at 256 GPUs that costs more than a
day. With alike rows it takes minutes, which makes the 256-GPU aggregated-vs-per-pair check
(experiments/sweeps/aggregation-check-256.textproto) runnable.

  python3 tools/alike_routing.py --experts 256 --zipf 1.2 > experiments/sweeps/alike-zipf1.2-e256.csv
"""
import argparse
import random

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--experts", type=int, required=True)
ap.add_argument("--zipf", type=float, default=0.0, help="Zipf exponent s (0: uniform)")
ap.add_argument("--tokens", type=int, default=4096, help="tokens per source (rows are rescaled to the model's)")
ap.add_argument("--top-k", type=int, default=2)
ap.add_argument("--iterations", type=int, default=2)
ap.add_argument("--seed", type=int, default=42, help="seed of the popularity permutation")
a = ap.parse_args()

E, slots = a.experts, a.tokens * a.top_k
rank = list(range(E))
random.Random(a.seed).shuffle(rank)  # rank[r]: the expert of popularity rank r + 1
weight = [0.0] * E
for r, e in enumerate(rank):
    weight[e] = (r + 1) ** -a.zipf
exact = [slots * w / sum(weight) for w in weight]
count = [int(x) for x in exact]
for e in sorted(range(E), key=lambda e: (count[e] - exact[e], e))[: slots - sum(count)]:
    count[e] += 1
assert sum(count) == slots and max(count) <= a.tokens, "a token reaches an expert at most once"

print("# moe-gating-trace v1")
print(f"# source: tools/alike_routing.py --experts {E} --zipf {a.zipf:g} --tokens {a.tokens} --top-k {a.top_k} "
      f"--iterations {a.iterations} --seed {a.seed} (every GPU routes alike; no sampling)")
print(f"# model: top_k={a.top_k}, num_experts={E}, moe_layers=1, src_ranks=1, microbatches_per_iter=1")
print(f"# tokens_per_microbatch_per_src={a.tokens}")
print("iter,layer,src," + ",".join(f"e{e}" for e in range(E)))
for it in range(1, a.iterations + 1):
    print(f"{it},0,0," + ",".join(map(str, count)))
