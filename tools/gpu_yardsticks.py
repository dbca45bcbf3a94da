# PyTorch's yardsticks on the GPU moesim's backend is compared with (docs/hardware.md): cuBLAS's
# rate for the demo's expert GEMM shapes, a batched against a looped expert FFN, HBM bandwidth by a
# device copy, the cost of a host-device round trip as FastMoE pays it, and the least time of a kernel. Needs torch with CUDA.
# CUDA events time the GPU work (ten calls after three warm-ups); wall clocks time the host syncs
# (2,000 calls after 50 warm-ups).
import time
import torch

def gpu_seconds(f, n=10):
    for _ in range(3):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e-3

def wall_us(f, n=2000):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

def gemms(d=1024, h=4096):
    for m in (1024, 8192):
        a = torch.randn(m, d, dtype=torch.float16, device='cuda')
        w = torch.randn(d, h, dtype=torch.float16, device='cuda')
        s = gpu_seconds(lambda: a @ w)
        print(f"GEMM {m} x {h} x {d} fp16: {2 * m * d * h / s / 1e12:.0f} TFLOP/s")
    E, m = 8, 1024
    x = torch.randn(E, m, d, dtype=torch.float16, device='cuda')
    w = torch.randn(E, d, h, dtype=torch.float16, device='cuda')
    flops = 2 * E * m * d * h
    print(f"{E} experts of {m} tokens: bmm {flops / gpu_seconds(lambda: torch.bmm(x, w)) / 1e12:.0f} TFLOP/s, "
          f"loop {flops / gpu_seconds(lambda: [x[i] @ w[i] for i in range(E)]) / 1e12:.0f} TFLOP/s")

def bandwidth():
    n = 256 << 20
    a = torch.empty(n // 2, dtype=torch.float16, device='cuda')
    b = torch.empty_like(a)
    print(f"device copy of 256 MiB: {2 * n / gpu_seconds(lambda: b.copy_(a)) / 1e9:.0f} GB/s (read + write)")

def host_sync():
    x = torch.ones(64, device='cuda', dtype=torch.int64)
    launch, two = wall_us(lambda: x.add_(1)), wall_us(lambda: x.add_(1).sum())
    item, cpu = wall_us(lambda: x.add_(1).sum().item()), wall_us(lambda: x.add_(1).cpu())
    print(f"launch {launch:.1f} us; .item() {item - two:.1f} us and .cpu() {cpu - launch:.1f} us beyond their launches")

def prepare_forward(E=64, T=8192, k=2):
    """laekov/fastmoe fmoe/functions.py count_by_gate + prepare_forward on one GPU: two .item() and
    three .cpu(), against the same kernels without them (assign_pos and the count exchange stood in
    for by argsort and a copy)."""
    gate = torch.randint(0, E, (T * k,), device='cuda')

    def prepare(sync):
        lec = torch.bincount(gate, minlength=E)
        lec_cum = torch.cumsum(lec, dim=0).int()
        if sync:
            lec_cum[-1].item()
        pos = torch.argsort(gate)
        gec = lec.clone()
        fec = gec.view(1, E).sum(dim=0)
        if sync:
            int(fec.sum().item())
            return pos, lec.cpu(), gec.cpu(), fec.cpu()
        return pos, lec, gec, fec
    with_sync, without = wall_us(lambda: prepare(True)), wall_us(lambda: prepare(False))
    print(f"prepare_forward {with_sync:.0f} us, {with_sync - without:.0f} us of it its host syncs")

def attention(tokens=4096, seq=512, d=1024, heads=16):
    """A BERT-style attention block as the papers' PyTorch code ran it, unfused (Megatron-LM's and
    fairseq's eager path): layer norm, QKV projection, per-head scores, softmax, dropout, context,
    output projection, dropout, residual; FP16. Hecate's cluster-B layer (BERT-MoE-Deep: 8 x 512
    tokens, d_model 1024, 16 heads) by default. Forward, and forward + backward (autograd); beside
    it PyTorch's fused scaled_dot_product_attention in the same block."""
    import torch.nn.functional as F
    b, hd = tokens // seq, d // heads
    x = torch.randn(b, seq, d, dtype=torch.float16, device='cuda', requires_grad=True)
    ln = torch.nn.LayerNorm(d).cuda().half()
    qkv = torch.nn.Linear(d, 3 * d).cuda().half()
    proj = torch.nn.Linear(d, d).cuda().half()
    grad = torch.randn_like(x)

    def block(fused):
        q, k, v = qkv(ln(x)).view(b, seq, 3, heads, hd).permute(2, 0, 3, 1, 4)
        if fused:
            c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        else:
            p = F.dropout(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / hd ** 0.5, dim=-1), 0.1)
            c = torch.matmul(p, v)
        return x + F.dropout(proj(c.permute(0, 2, 1, 3).reshape(b, seq, d)), 0.1)
    for fused in (False, True):
        f = gpu_seconds(lambda: block(fused))
        fb = gpu_seconds(lambda: block(fused).backward(grad))
        print(f"attention block {b} x {seq} tokens, d {d}, {heads} heads, {'fused sdpa' if fused else 'unfused'}: "
              f"forward {f * 1e3:.3f} ms, backward {(fb - f) * 1e3:.3f} ms")

def kernel_floor(n=1000):
    """The least time a kernel takes on the GPU when its host is ahead (GpuSpec.kernel_us): n
    kernels queued behind a sleep kernel of about 20 ms, which the host outpaces, timed from the
    sleep's end to the last one's end. Three kinds: add_ on 64 floats, add_ on 1 MiB (its bytes
    about 0.5 us through HBM), and a gate's softmax over 4,096 x 8 logits. Median of five runs."""
    small, mib = torch.ones(64, device='cuda'), torch.ones(1 << 18, device='cuda')
    logits = torch.randn(4096, 8, device='cuda', dtype=torch.float16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for label, f in (("add_ on 64 floats", lambda: small.add_(1)), ("add_ on 1 MiB", lambda: mib.add_(1)),
                     ("softmax of 4096 x 8", lambda: torch.softmax(logits, dim=-1))):
        runs = []
        for _ in range(6):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(40e6))  # cycles: about 20 ms at 2 GHz
            start.record()
            for _ in range(n):
                f()
            end.record()
            torch.cuda.synchronize()
            runs.append(start.elapsed_time(end) / n * 1e3)
        runs = sorted(runs[1:])
        print(f"kernel floor, {label}: {runs[len(runs) // 2]:.2f} us a kernel (runs {runs[0]:.2f}-{runs[-1]:.2f})")

if __name__ == '__main__':
    import sys
    names = ('gemms', 'bandwidth', 'host_sync', 'prepare_forward', 'attention', 'kernel_floor')
    chosen = sys.argv[1:2] or names  # one yardstick by name: python3 tools/gpu_yardsticks.py kernel_floor
    if chosen[0] not in names:
        sys.exit(f"usage: python3 tools/gpu_yardsticks.py [{' | '.join(names)}]")
    print(torch.cuda.get_device_name(), 'torch', torch.__version__)
    for name in chosen:
        globals()[name]()
