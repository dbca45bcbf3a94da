"""Record the gating of a PyTorch MoE training run as a moesim trace.

    from moesim_trace import Recorder
    recorder = Recorder("run/gating", model, gates=lambda name, m: name.endswith(".gate"), top_k=2, experts=16)
    ...                      # each training iteration, after the forward passes:
    recorder.step()
    recorder.close()

Each rank writes run/gating.rank{R}.trace; `moesim trace import run/gating.rank*.trace -o run.trace`
merges them into one trace that `moesim run` replays (docs/gating.md, "Recording a PyTorch run").
"""
from .recorder import GateOutputError, Recorder, topk_indices

__all__ = ["Recorder", "GateOutputError", "topk_indices"]
