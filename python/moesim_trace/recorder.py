"""The recorder: forward hooks on a model's gate modules that count token-slots per expert.

A gate's output is read by gate_counts(): router logits or scores (a floating tensor [..., E]: its
top-k along the last dimension, as the layer routes), expert indices (an integer tensor [..., k]),
a dispatch mask (a boolean tensor [T, E] or [T, E, C], as fairseq, DeepSpeed, Tutel and Megatron-Core
gates return), or a tuple or dict holding one of them. `read=` takes any other layout.

Counting stays on the device: one bincount (or one sum) per gate call, added into a [layers, E]
tensor; step() copies it to the host once per iteration and appends one record per layer to this
rank's file, in moesim's trace format (proto/moesim.proto TraceHeader / TraceRecord, length
delimited after an 8-byte magic; the classes are generated from the .proto by the build).
"""
import os
import uuid

import torch
from google.protobuf.internal.encoder import _VarintBytes

from . import moesim_pb2

MAGIC = b"MOESIMGT"  # workloads/trace.cpp kMagic


class GateOutputError(TypeError):
    """A gate module's output that the recorder cannot read as top-k routing."""


def _mask_counts(mask, experts):
    if mask.dim() == 2 and mask.shape[1] == experts:  # [T, E]
        return mask.sum(0, dtype=torch.int64)
    if mask.dim() == 3 and mask.shape[1] == experts:  # [T, E, C]
        return mask.sum((0, 2), dtype=torch.int64)
    return None


def _count(indices, experts):
    # scatter_add, not bincount: bincount sizes its result by the largest index, a device sync.
    idx = indices.reshape(-1).to(torch.int64)
    return torch.zeros(experts, dtype=torch.int64, device=idx.device).scatter_add_(0, idx, torch.ones_like(idx))


def gate_counts(output, top_k, experts, module_name="gate"):
    """Token-slots per expert (an int64 tensor [experts], on the output's device) of one gate call."""

    def from_tensor(t, allow_mask=True):
        if not torch.is_tensor(t):
            return None
        if t.dtype == torch.bool:
            return _mask_counts(t, experts) if allow_mask else None
        if t.is_floating_point():
            if t.dim() >= 1 and t.shape[-1] == experts:  # logits or scores: route as the layer does
                return _count(t.reshape(-1, experts).topk(top_k, dim=-1).indices, experts)
            return None
        if t.dim() >= 1 and t.shape[-1] == top_k:  # expert indices (each in [0, experts))
            return _count(t, experts)
        return None

    got = from_tensor(output)
    if got is not None:
        return got
    items = []
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (tuple, list)):
        items = list(output)
    elif hasattr(output, "indices"):
        items = [output.indices]
    # A dispatch mask first (DeepSpeed's and fairseq's tuples also hold per-expert counts and
    # weights), then indices, then scores.
    for kind in ("mask", "indices", "scores"):
        for item in items:
            if not torch.is_tensor(item):
                continue
            is_kind = {"mask": item.dtype == torch.bool,
                       "indices": item.dtype != torch.bool and not item.is_floating_point(),
                       "scores": item.is_floating_point()}[kind]
            if is_kind:
                got = from_tensor(item)
                if got is not None:
                    return got
    shapes = ", ".join(f"{type(x).__name__}{list(x.shape) if torch.is_tensor(x) else ''}" for x in (items or [output]))
    raise GateOutputError(
        f"{module_name}: cannot read top-{top_k} routing over {experts} experts from its output ({shapes}); "
        f"expected logits or scores [..., {experts}], expert indices [..., {top_k}] (integer), a boolean dispatch "
        f"mask [T, {experts}] or [T, {experts}, C], or a tuple or dict holding one; pass read=... to Recorder "
        f"for another layout")


def topk_indices(logits, top_k):
    """The top-k expert indices of router logits [..., E], as a layer routes them (for read=...)."""
    return logits.topk(top_k, dim=-1).indices


def _delimited(message):
    data = message.SerializeToString()
    return _VarintBytes(len(data)) + data


class Recorder:
    """Records the routing of `model`'s gate modules, one file per rank: PREFIX.rank{R}.trace.

    gates: the modules whose outputs are routing decisions, in layer order: a list, or a predicate
      (name, module) -> bool over model.named_modules().
    top_k, experts: the gate's k and the experts per layer (every gate the same).
    run: an id shared by the run's ranks (default: rank 0 draws one and broadcasts it when
      torch.distributed is initialised); `moesim trace import` refuses rank files of different runs.
    read: output -> counts [E], indices [..., k] or a mask, for a gate layout gate_counts() lacks.
    training_only: count only while the gate module is in training mode (default True).
    """

    def __init__(self, prefix, model, gates, top_k, experts, *, run=None, name="", provenance="", read=None,
                 training_only=True):
        if callable(gates) and not isinstance(gates, (list, tuple)):
            modules = [(n, m) for n, m in model.named_modules() if gates(n, m)]
        else:
            names = {id(m): n for n, m in model.named_modules()}
            modules = [(names.get(id(m), type(m).__name__), m) for m in gates]
        if not modules:
            raise ValueError("Recorder: no gate module matched; pass the gate modules or a predicate "
                             "(name, module) -> bool that selects them")
        if not (1 <= top_k <= experts):
            raise ValueError(f"Recorder: top_k {top_k} must be between 1 and experts ({experts})")
        dist = torch.distributed
        self.rank, self.world_size = 0, 1
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            if run is None:
                box = [uuid.uuid4().hex if self.rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                run = box[0]
        self.run = run or uuid.uuid4().hex
        self.top_k, self.experts, self.read = top_k, experts, read
        self.training_only = training_only
        self.layers = len(modules)
        self.iteration = 0
        self._counts = None  # [layers, experts] int64 on the gates' device, this iteration's
        self.path = f"{prefix}.rank{self.rank}.trace"
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        header = moesim_pb2.TraceHeader(
            version=1, model=name or type(model).__name__,
            provenance=provenance or "recorded by python/moesim_trace", experts=experts, top_k=top_k,
            layers=self.layers, sources=1, iteration_stride=1, run=self.run, rank=self.rank,
            world_size=self.world_size)
        self._file = open(self.path + ".tmp", "wb")
        self._file.write(MAGIC + _delimited(header))
        self._hooks = [m.register_forward_hook(self._hook(layer, n)) for layer, (n, m) in enumerate(modules)]

    def _hook(self, layer, module_name):
        def hook(module, _inputs, output):
            if self.training_only and not module.training:
                return
            out = self.read(output) if self.read else output
            counts = gate_counts(out, self.top_k, self.experts, module_name)
            if self._counts is None:
                self._counts = torch.zeros(self.layers, self.experts, dtype=torch.int64, device=counts.device)
            self._counts[layer] += counts
        return hook

    def step(self):
        """Ends an iteration: its counts, one record per layer, go to the file (one host copy)."""
        if self._file is None:
            raise RuntimeError("Recorder: step() after close()")
        host = self._counts.cpu() if self._counts is not None else torch.zeros(self.layers, self.experts, dtype=torch.int64)
        for layer in range(self.layers):
            record = moesim_pb2.TraceRecord(iteration=self.iteration, layer=layer, dense=host[layer].tolist())
            self._file.write(_delimited(record))
        if self._counts is not None:
            self._counts.zero_()
        self.iteration += 1

    def close(self):
        """Removes the hooks and publishes the file (written aside until now, so no reader sees half)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._file is not None:
            self._file.close()
            self._file = None
            os.replace(self.path + ".tmp", self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
