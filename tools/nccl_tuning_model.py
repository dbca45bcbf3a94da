#!/usr/bin/env python3
# NCCL's AllReduce algorithm choice (Ring vs Tree), as docs/collectives.md quotes it: a re-implementation
# of NCCL's cost model for the systems moesim models, with the per-system graph values (channels,
# bwIntra/bwInter) traced by hand through NCCL's topology search, not logged from a machine. Not run by
# CI. Usage: python3 tools/nccl_tuning_model.py [-v]
# Re-implementation of NCCL 2.30.7 (commit 5067397c) ncclTopoTuneModel + ncclTopoGetAlgoTime
# for AllReduce, RING vs TREE (NVLS/CollNet/PAT not applicable here). Sources: src/graph/tuning.cc.
import math
LL, LL128, SIMPLE = 0, 1, 2
PN = ["LL", "LL128", "Simple"]
baseLat = {"tree": [6.8, 14.0, 8.4], "ring": [6.6, 14.0, 8.4]}
hwLat = {"NVLINK": {"tree": [0.6, 1.25, 4.0], "ring": [0.6, 1.9, 3.4]},
         "PCI":    {"tree": [1.0, 1.9, 4.0], "ring": [1.0, 2.5, 5.7]},
         "NET":    {"tree": [5.0, 8.5, 14.0], "ring": [2.7, 4.0, 14.0]}}
llMaxBws = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0]]          # [intel(0)/amd(1)][N1,N2,N4+] (multi-node index1 = CPU)
perChMaxRingLL128 = {"volta": [20, 20, 20], "ampere": [20, 20, 20]}
perChMaxTreeLL128 = {"volta": [20, 20, 20], "ampere": [20, 20, 20]}
perChMaxTree = {"volta": [26.5, 18.5, 10.0], "ampere": [24.0, 23.6, 17.8]}
treeCorr = [[1.0,1.0,1.0,1.0,.9,.8,.7,.7,.7,.7,.6,.5,.4,.4,.5,.6,.7,.8,.9,1.0,1.0,1.0,1.0,1.0],
            [1.0,1.0,1.0,1.0,1.0,.9,.8,.8,.8,.7,.6,.6,.6,.6,.6,.6,.8,.9,.9,.9,.9,1.0,1.0,1.0],
            [.9,.9,.9,.9,.9,.9,.9,.8,.7,.6,.6,.5,.5,.5,.5,.6,.7,.8,.7,.7,.8,.9,.9,.9]]
def log2i(n): return n.bit_length() - 1

def tune(sys, nNodes):
    ppn = sys["ppn"]; nRanks = ppn * nNodes
    arch = sys["arch"]; idx2 = nNodes - 1 if nNodes <= 2 else 2
    cpu = 1 if sys["cpu"] == "amd" else 0
    llMax = llMaxBws[cpu][idx2]
    netOver = 2.0 if sys["cpu"] == "amd" else 1.0
    nsteps = 2 * (nRanks - 1)
    bw, lat = {}, {}
    for a in ("ring", "tree"):
        g = sys[a]   # dict nCh, bwIntra, bwInter
        for p in (LL, LL128, SIMPLE):
            b = g["bwIntra"] if nNodes <= 2 else g["bwInter"]
            busBw = g["nCh"] * b
            if a == "ring" and p == LL: busBw = min(llMax, busBw * .5)
            if a == "ring" and p == LL128: busBw = min(busBw * .92, g["nCh"] * perChMaxRingLL128[arch][idx2])
            if a == "tree": busBw = min(busBw * .92, g["nCh"] * perChMaxTree[arch][idx2])
            if a == "tree" and p == LL: busBw = min(busBw / 3.8, llMax)
            if a == "tree" and p == LL128: busBw = min(busBw * (120.0/128.0), g["nCh"] * perChMaxTreeLL128[arch][idx2])
            busBw *= (nRanks / nsteps) if a == "ring" else 0.5
            if p == LL128 and not sys["ll128"]: busBw = 0
            if p not in sys.get("protos", (LL, LL128, SIMPLE)): busBw = 0
            L = baseLat[a][p]
            intraLat = hwLat[sys["intraHw"]][a][p]
            interLat = (hwLat["NET"]["tree"][p] if ppn == 1 else hwLat["NET"][a][p]) + sys["netLat"]
            if p == SIMPLE: interLat += sys["netLat"]
            if a == "ring":
                no = netOver * (3 if p == SIMPLE else 1)
                il = max(intraLat, no)
                nInter = 2 * (nNodes - 1)
                L += (nsteps - nInter) * il + nInter * interLat
            else:
                L += 2 * ((ppn - 1) * intraLat + log2i(nNodes) * interLat)
            bw[(a, p)] = busBw; lat[(a, p)] = L
    return bw, lat, nRanks

def algoTime(sys, nNodes, a, p, nBytes, tbl):
    bw, lat, nRanks = tbl
    b = bw[(a, p)]; L = lat[(a, p)]
    if b == 0: return None
    ls = log2i(nBytes >> 6)
    if a == "tree" and 0 <= ls < 23: b *= treeCorr[p][ls]
    if a == "ring" and p == SIMPLE and nNodes > 1 and nBytes // (sys["commCh"] * nRanks) >= 64:
        L *= 1.4 if sys["arch"] == "ampere" else 1.9
    return L + nBytes / (1000 * b)

def choose(sys, nNodes, nBytes):
    tbl = tune(sys, nNodes)
    best = None; allt = {}
    for a in ("tree", "ring"):          # NCCL iterates algo index TREE(0) before RING(1); strict '<'
        for p in (LL, LL128, SIMPLE):
            t = algoTime(sys, nNodes, a, p, nBytes, tbl)
            if t is None: continue
            allt[(a, p)] = t
            if best is None or t < best[0]: best = (t, a, p)
    return best, allt, tbl

SYS = {
 "a_DGXA100": dict(ppn=8, arch="ampere", cpu="amd", intraHw="NVLINK", ll128=True, netLat=0.0,
                  ring=dict(nCh=8, bwIntra=24, bwInter=24), tree=dict(nCh=8, bwIntra=30, bwInter=24), commCh=16),
 "b_p4d":     dict(ppn=8, arch="ampere", cpu="intel", intraHw="NVLINK", ll128=True, netLat=75.0, protos=(SIMPLE,),
                  ring=dict(nCh=4, bwIntra=12, bwInter=12), tree=dict(nCh=4, bwIntra=24, bwInter=12), commCh=8),
 "b_p4d_allprotos": dict(ppn=8, arch="ampere", cpu="intel", intraHw="NVLINK", ll128=True, netLat=75.0,
                  ring=dict(nCh=4, bwIntra=12, bwInter=12), tree=dict(nCh=4, bwIntra=24, bwInter=12), commCh=8),
 "c_DGX1V":   dict(ppn=8, arch="volta", cpu="intel", intraHw="NVLINK", ll128=True, netLat=0.0,
                  ring=dict(nCh=4, bwIntra=12, bwInter=12), tree=dict(nCh=4, bwIntra=20, bwInter=12), commCh=8),
 "d_4xPCIe_gen3": dict(ppn=4, arch="volta", cpu="intel", intraHw="PCI", ll128=False, netLat=0.0,
                  ring=dict(nCh=1, bwIntra=12, bwInter=12), tree=dict(nCh=1, bwIntra=7, bwInter=7), commCh=2),
 "d_4xPCIe_gen4_A100": dict(ppn=4, arch="ampere", cpu="amd", intraHw="PCI", ll128=False, netLat=0.0,
                  ring=dict(nCh=1, bwIntra=12, bwInter=12), tree=dict(nCh=1, bwIntra=18, bwInter=12), commCh=2),
}
SIZES = [("1MiB", 1 << 20), ("16MiB", 16 << 20), ("64MiB", 64 << 20), ("256MiB", 256 << 20), ("1GiB", 1 << 30)]
if __name__ == "__main__":
    import sys as _s
    for name, s in SYS.items():
        nodes = [2, 4] if name.startswith("b_") else [2, 4, 8, 16]
        print(f"== {name}")
        for N in nodes:
            row = []
            for lab, nb in SIZES:
                best, allt, tbl = choose(s, N, nb)
                rt = min((v for (a, p), v in allt.items() if a == "ring"), default=None)
                tt = min((v for (a, p), v in allt.items() if a == "tree"), default=None)
                row.append(f"{lab}:{best[1].upper()}/{PN[best[2]]} (R {rt:.0f} T {tt:.0f}us)")
            print(f" N={N:2d} " + " | ".join(row))
        if "-v" in _s.argv:
            for N in nodes:
                bw, lat, nR = tune(s, N)
                print("   N=%d " % N + " ".join(f"{a}/{PN[p]}={bw[(a,p)]:.1f}GB/s,{lat[(a,p)]:.1f}us" for (a,p) in bw))
