#!/usr/bin/env python3
"""Runs FasterMoE's released shadowing policy over a grid of routings and writes its decisions.

The function run is `global_policy` of laekov/fastmoe's fmoe/fastermoe/shadow_policy.py, loaded
from a FastMoE checkout (not copied into moesim), in a real torch.distributed gloo group of
`world_size` CPU processes: each rank passes its own row of per-expert token counts, the function
all-gathers them, as it does in training, and returns the experts it shadows. It runs twice per
routing:
  as_shipped   the file as released: the gathered [rank, expert] counts summed with .sum(1), i.e.
               per rank (under top-k gating every rank sends the same number of slots, so it
               shadows nothing);
  per_expert   the same file with that one .sum(1) replaced by .sum(0), the per-expert loads its
               loop is written for.
tests/data/fastermoe-released-policy.tsv is this script's output; tests/test_fastermoe.cpp checks
that moesim's released rule (policies/fastermoe.cpp) reproduces every row of it, both countings.

Needs Debian's python3-torch (1.13 was used; Debian's own interpreter, /usr/bin/python3) and a
FastMoE checkout (ee3c561 was used); about a minute on 2 cores. Not run in CI; the table it wrote is:
  apt-get install python3-torch
  /usr/bin/python3 tools/fastermoe_released_policy.py --fastmoe /path/to/fastmoe > tests/data/fastermoe-released-policy.tsv

Columns: world_size, num_expert (experts per rank), d_model, the environment constants set
(FMOE_FASTER_GLBPLC_NETBW, _GPUTP, _ALPHA; "-" where the release's default applies), the counts
(rank-major: counts[r * E + e] is what rank r sends to global expert e; E = world_size *
num_expert), and the shadowed experts of each run, ascending, "-" for none.
"""
import argparse
import importlib.util
import os
import random
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ENV = ("FMOE_FASTER_GLBPLC_NETBW", "FMOE_FASTER_GLBPLC_GPUTP", "FMOE_FASTER_GLBPLC_ALPHA")


def load_policy(fastmoe, per_expert):
    """global_policy from the checkout's shadow_policy.py, with the two fmoe modules it imports."""
    fmoe = types.ModuleType("fmoe")
    fmoe.__path__ = []
    functions = types.ModuleType("fmoe.functions")
    functions.get_moe_group = lambda: None  # None: the default group, which is the gloo group here
    sys.modules.setdefault("fmoe", fmoe)
    sys.modules["fmoe.functions"] = functions
    pkg = types.ModuleType("fmoe.fastermoe")
    pkg.__path__ = [os.path.join(fastmoe, "fmoe", "fastermoe")]
    sys.modules["fmoe.fastermoe"] = pkg
    spec = importlib.util.spec_from_file_location(
        "fmoe.fastermoe.config", os.path.join(fastmoe, "fmoe", "fastermoe", "config.py"))
    config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config)
    sys.modules["fmoe.fastermoe.config"] = config
    with open(os.path.join(fastmoe, "fmoe", "fastermoe", "shadow_policy.py")) as f:
        source = f.read()
    if per_expert:
        assert source.count(".sum(1)") == 1, "expected exactly one .sum(1) in shadow_policy.py"
        source = source.replace(".sum(1)", ".sum(0)")
    module = types.ModuleType("fmoe.fastermoe.shadow_policy_" + ("per_expert" if per_expert else "as_shipped"))
    module.__package__ = "fmoe.fastermoe"
    exec(compile(source, "shadow_policy.py", "exec"), module.__dict__)
    return module.global_policy


def routings(world_size, num_expert):
    """The grid for one group size: (d_model, env, counts) triples, seeded, the same in every rank."""
    E = world_size * num_expert
    rnd = random.Random(1000 * world_size + num_expert)
    out = []

    def rows_from(weights, tokens):
        # Each rank sends `tokens` slots, split over the experts by `weights` (largest remainder).
        rows = []
        for r in range(world_size):
            w = [max(0.0, x * rnd.lognormvariate(0, 0.1)) for x in weights]
            exact = [tokens[r] * x / sum(w) for x in w]
            row = [int(x) for x in exact]
            for e in sorted(range(E), key=lambda e: (row[e] - exact[e], e))[: tokens[r] - sum(row)]:
                row[e] += 1
            rows.extend(row)
        return rows

    shapes = {
        "uniform": [1.0] * E,
        "one hot": [8.0 if e == 0 else 1.0 for e in range(E)],
        "two hot": [8.0 if e in (0, 1) else 1.0 for e in range(E)],
    }
    for s in (0.6, 1.0, 1.4, 2.0):
        perm = list(range(E))
        rnd.shuffle(perm)
        shapes[f"zipf {s}"] = [(perm[e] + 1) ** -s for e in range(E)]
    for sigma in (1.0, 2.0):
        shapes[f"lognormal {sigma}"] = [rnd.lognormvariate(0, sigma) for _ in range(E)]
    for d_model in (512, 1024, 2048, 4096):
        for name, weights in shapes.items():
            even = [2048 * 2] * world_size  # 2048 tokens, top-2: the same slots per rank
            out.append((d_model, {}, rows_from(weights, even)))
    # Ranks that send different numbers of slots (the only case the as-shipped sum can act on).
    for d_model in (1024, 4096):
        uneven = [rnd.choice((512, 2048, 8192, 16384)) for _ in range(world_size)]
        out.append((d_model, {}, rows_from(shapes["zipf 1.4"], uneven)))
    # The constants overridden by their environment variables.
    out.append((2048, {"FMOE_FASTER_GLBPLC_NETBW": 100e9 / 8}, rows_from(shapes["zipf 1.0"], [4096] * world_size)))
    out.append((2048, {"FMOE_FASTER_GLBPLC_GPUTP": 100e12}, rows_from(shapes["zipf 1.0"], [4096] * world_size)))
    out.append((1024, {"FMOE_FASTER_GLBPLC_ALPHA": 4}, rows_from(shapes["zipf 1.4"], [4096] * world_size)))
    return out


def worker(rank, world_size, num_expert, fastmoe, init_file, result):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size)
    policies = {"as_shipped": load_policy(fastmoe, False), "per_expert": load_policy(fastmoe, True)}
    E = world_size * num_expert
    lines = []
    for d_model, env, counts in routings(world_size, num_expert):
        for k in ENV:
            os.environ.pop(k, None)
        for k, v in env.items():
            os.environ[k] = repr(float(v))
        os.environ["FMOE_FASTER_GLBPLC_DMODEL"] = str(d_model)  # as get_shadow_policy(d_model) sets it
        local = torch.tensor(counts[rank * E:(rank + 1) * E], dtype=torch.int64)
        chosen = {}
        for name, policy in policies.items():
            res = policy(local, None, num_expert, world_size, "cpu")
            chosen[name] = ",".join(str(i) for i in res.nonzero().flatten().tolist()) or "-"
        if rank == 0:
            consts = "\t".join(repr(float(env[k])) if k in env else "-" for k in ENV)
            lines.append(f"{world_size}\t{num_expert}\t{d_model}\t{consts}\t{','.join(map(str, counts))}\t"
                         f"{chosen['as_shipped']}\t{chosen['per_expert']}")
    if rank == 0:
        with open(result, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fastmoe", required=True, help="a laekov/fastmoe checkout (ee3c561 was used)")
    ap.add_argument("--world-sizes", default="4,8,16")
    a = ap.parse_args()
    print("# FasterMoE's released global_policy (laekov/fastmoe fmoe/fastermoe/shadow_policy.py), "
          "written by tools/fastermoe_released_policy.py")
    print("# world_size\tnum_expert\td_model\t" + "\t".join(ENV) + "\tcounts\tas_shipped\tper_expert")
    for ws in (int(w) for w in a.world_sizes.split(",")):
        for num_expert in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                result = os.path.join(tmp, "result.tsv")
                mp.spawn(worker, args=(ws, num_expert, os.path.abspath(a.fastmoe), os.path.join(tmp, "init"), result),
                         nprocs=ws, join=True)
                with open(result) as f:
                    sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
