#!/usr/bin/env python3
"""The prefill attention kernel (crates/backend/src/cuda/flash_attention.cu) on its own, llm.c's dev/cuda habit.

Builds the runner's kernel text the way crates/models/src/cuda/kernels.rs does (the model's #defines, prelude.cu,
kernels.cu, flash_attention.cu) with NVRTC for sm_90a, then for each shape (heads, KV heads, head_dim) and chunk
(rows m at position start) on random data with a shuffled page table (unused cache slots hold NaN):
  - flash_attention (+ flash_combine when it splits) against an f32 reference (torch, no TF32) and the reference
    against f64 on a sample of rows: max abs error and ||out - ref|| / ||ref||, every output written (poisoned first);
  - the GEMM path it replaced (kv_gather, to_f16, per 512-row block cuBLAS scores, softmax_causal, cuBLAS P V), run
    with the same kernels and cuBLAS calls as `gemm_attention` made before: its error and its time (needs a
    kernels.cu that still has kv_gather and softmax_causal, with prelude.cu beside it: `--kernels DIR/kernels.cu`
    after `git show dc4d854:crates/backend/src/cuda/kernels.cu > DIR/kernels.cu` and prelude.cu copied; else skipped);
  - times (CUDA events, median) of both.
Needs torch with CUDA (the device machine's python3); `--compile-only` needs only libnvrtc (resources per kernel).

  python3 scripts/cuda/flash_attn_test.py [--kernels DIR/kernels.cu] [--warps 4,8]
Results of 2026-12-02: benchmarks/2026-12-02-cuda-flash.txt (benchmarks/core-cuda/flash.sh runs it on the device).
"""

import argparse
import ctypes
import glob
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CUDA_DIR = os.path.join(ROOT, "crates", "backend", "src", "cuda")
ATT_BLOCK_ROWS = 512  # the GEMM path's query rows per block
PAGE = 64
MIN_BLOCKS = 264  # flash_plan: mirrors FLASH_MIN_BLOCKS in crates/models/src/cuda/prefill.rs
MIN_SPLIT_KEYS = 512


def find_lib(names, patterns):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    roots = sys.path + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"]
    for r in roots:
        for pat in patterns:
            for p in sorted(glob.glob(os.path.join(r, pat)), reverse=True):
                try:
                    return ctypes.CDLL(p)
                except OSError:
                    pass
    raise OSError(f"none of {names} found")


def source(nh, nkv, d, warps, kernels_cu, flash_cu):
    """The runner's kernel text for a model with these attention shapes (other sizes as the 1.5B's)."""
    defs = dict(HIDDEN=1536, Q_DIM=nh * d, KV_DIM=nkv * d, HEAD_DIM=d, NUM_HEADS=nh, NUM_KV_HEADS=nkv, FFN=8960,
                ROPE_DIM=d, ROPE_NEOX=1, PAGE_SIZE=PAGE, MAX_PAGES=2048, ATT_WARPS=4)
    s = "".join(f"#define {k} {v}\n" for k, v in defs.items())
    s += "#define RMS_EPS 1e-6f\n#define REPACK 1\n#define ATT_DYN 1\n#define XPERM 1\n#define FUSE_NORM 1\n"
    s += "#define QKV_ROPE 1\n#define ATT_MIN_SPLIT 128\n#define ATT_CL 8\n#define ATT_SPLITS 16\n#define ATT_LONG 0\n"
    s += f"#define GU_DOT2 1\n#define FA_WARPS {warps}\n"
    for p in [os.path.join(os.path.dirname(kernels_cu), "prelude.cu"), kernels_cu, flash_cu]:
        s += open(p).read() + "\n"
    return s


def nvrtc_compile(nvrtc, src, arch="sm_90a", verbose=False):
    prog = ctypes.c_void_p()
    r = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"splash.cu", 0, None, None)
    if r:
        raise RuntimeError(f"nvrtcCreateProgram: {r}")
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--std=c++17"]
    if verbose:
        opts.append(b"--ptxas-options=-v")
    arr = (ctypes.c_char_p * len(opts))(*opts)
    res = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    if res:
        raise RuntimeError(f"NVRTC failed ({res}):\n{log}")
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    bin_ = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetCUBIN(prog, bin_)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return bin_.raw, log


def flash_plan(m, start, group, nkv, warps):
    """(row blocks, splits, keys per split) of flash_attention: the same rule as `flash_plan` in prefill.rs."""
    rb = -(-m * group // (16 * warps))
    keys = -(-(start + m) // PAGE) * PAGE
    splits = 1
    if nkv * rb < MIN_BLOCKS:
        splits = max(1, min(-(-MIN_BLOCKS // (nkv * rb)), keys // MIN_SPLIT_KEYS))
    kps = -(-(-(-keys // splits)) // PAGE) * PAGE
    return rb, -(-keys // kps), kps


class Gpu:
    """Kernels through the driver API and cuBLAS through its C API (ctypes), on torch's memory and default stream."""

    def __init__(self, torch):
        self.torch = torch
        torch.zeros(1, device="cuda")  # the primary context, current on this thread
        self.cu = find_lib(["libcuda.so.1", "libcuda.so"], ["libcuda.so*"])
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.blas = None
        try:
            self.blas = find_lib(["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
                                 ["nvidia/cu13/lib/libcublas.so.*", "nvidia/cublas/lib/libcublas.so.*", "libcublas.so.*"])
            self.h = ctypes.c_void_p()
            self.ck(self.blas.cublasCreate_v2(ctypes.byref(self.h)), "cublasCreate")
            f = self.blas.cublasGemmStridedBatchedEx
            P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            f.argtypes = [P, I, I, I, I, I, P, P, I, I, L, P, I, I, L, P, P, I, I, L, I, I, I]
        except Exception as e:  # the baseline is then skipped
            print(f"cuBLAS unavailable: {e}")
            self.blas = None

    @staticmethod
    def ck(r, what):
        if r:
            raise RuntimeError(f"{what}: error {r}")

    def load(self, cubin):
        mod = ctypes.c_void_p()
        self.ck(self.cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin)), "cuModuleLoadData")
        return mod

    def func(self, mod, name):
        f = ctypes.c_void_p()
        self.ck(self.cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), f"cuModuleGetFunction {name}")
        return f

    def launch(self, f, grid, block, args):
        vals = [ctypes.c_uint64(a.data_ptr()) if hasattr(a, "data_ptr") else
                (ctypes.c_uint64(a[1]) if isinstance(a, tuple) else ctypes.c_int32(a)) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        g = tuple(grid) + (1,) * (3 - len(grid))
        self.ck(self.cu.cuLaunchKernel(f, g[0], g[1], g[2], block, 1, 1, 0, None, params, None), "cuLaunchKernel")

    def gemm(self, ta, tb, m, n, k, alpha, a, atype, lda, sa, b, btype, ldb, sb, c, ctype, ldc, sc, batch):
        """cublasGemmStridedBatchedEx as Blas::gemm calls it (types 2 = f16, 0 = f32; f32 compute)."""
        al, be = ctypes.c_float(alpha), ctypes.c_float(0.0)
        self.ck(self.blas.cublasGemmStridedBatchedEx(
            self.h, int(ta), int(tb), m, n, k, ctypes.cast(ctypes.pointer(al), ctypes.c_void_p), a, atype, lda, sa,
            b, btype, ldb, sb, ctypes.cast(ctypes.pointer(be), ctypes.c_void_p), c, ctype, ldc, sc, batch, 68, -1),
            "cublasGemmStridedBatchedEx")


def timed(torch, fn, min_s=0.3, max_reps=50):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    t_end = time.time() + min_s
    while len(ts) < 3 or (time.time() < t_end and len(ts) < max_reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def case(torch, gpu, mods, nh, nkv, d, m, start, args):
    """One chunk: errors and times of each flash variant and of the GEMM path."""
    group, qd, kvd = nh // nkv, nh * d, nkv * d
    kv_len = start + m
    npages = -(-kv_len // PAGE)
    pool = npages + 3
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(hash((nh, nkv, d, m, start, time.time_ns())) & 0x7FFFFFFF)
    perm = torch.randperm(pool, generator=gen, device=dev).to(torch.int32)
    table = torch.zeros(2048, dtype=torch.int32, device=dev)
    table[:npages] = perm[:npages]
    # Cache pool [page][64][KV_DIM], NaN except the sequence's positions.
    kc = torch.full((pool * PAGE, kvd), float("nan"), dtype=torch.float16, device=dev)
    vc = torch.full_like(kc, float("nan"))
    slots = (table[:npages].long()[:, None] * PAGE + torch.arange(PAGE, device=dev)[None, :]).reshape(-1)[:kv_len]
    K = torch.randn(kv_len, kvd, generator=gen, device=dev).half()
    V = torch.randn(kv_len, kvd, generator=gen, device=dev).half()
    kc[slots] = K
    vc[slots] = V
    q = torch.randn(m, qd, generator=gen, device=dev) * args.qscale
    # f32 reference on f16-rounded inputs.
    torch.backends.cuda.matmul.allow_tf32 = False
    q16, Kf, Vf = q.half().float(), K.float(), V.float()
    ref = torch.empty(m, qd, device=dev)
    scale = 1.0 / math.sqrt(d)
    causal = torch.arange(kv_len, device=dev)[None, :] > (start + torch.arange(m, device=dev))[:, None]
    for h in range(nh):
        g = h // group
        s = (q16[:, h * d:(h + 1) * d] @ Kf[:, g * d:(g + 1) * d].T) * scale
        s.masked_fill_(causal, float("-inf"))
        ref[:, h * d:(h + 1) * d] = torch.softmax(s, dim=1) @ Vf[:, g * d:(g + 1) * d]
    del causal
    # The reference itself against f64 on a sample of rows.
    rows = torch.randperm(m, generator=gen, device=dev)[:32]
    r64err = 0.0
    for h in range(nh):
        g = h // group
        s = (q16[rows, h * d:(h + 1) * d].double() @ Kf[:, g * d:(g + 1) * d].double().T) * scale
        s.masked_fill_(torch.arange(kv_len, device=dev)[None, :] > (start + rows)[:, None], float("-inf"))
        o64 = torch.softmax(s, dim=1) @ Vf[:, g * d:(g + 1) * d].double()
        r64err = max(r64err, (o64 - ref[rows, h * d:(h + 1) * d].double()).abs().max().item())

    def err(out):
        if not torch.isfinite(out).all():
            return float("nan"), float("nan")
        return (out - ref).abs().max().item(), ((out - ref).norm() / ref.norm()).item()

    res = []
    outs = {}
    for warps, (mod, fa, fc, ts, sm) in mods.items():
        rb, splits, kps = flash_plan(m, start, group, nkv, warps)
        out = torch.full((m, qd), float("nan"), device=dev)
        part = torch.empty(max(1, splits * m * qd) if splits > 1 else 1, device=dev)
        lse = torch.empty(max(1, splits * m * nh) if splits > 1 else 1, device=dev)

        def run():
            gpu.launch(fa, (nkv, rb, splits), 32 * warps, [q, kc, vc, table, out, part, lse, m, start, kps])
            if splits > 1:
                gpu.launch(fc, (m, nh), d, [part, lse, out, m, splits])

        run()
        torch.cuda.synchronize()
        e = err(out)
        outs[warps] = out.clone()
        t = timed(torch, run)
        res.append((f"flash w{warps} (grid {nkv}x{rb}x{splits})", e, t))
    if gpu.blas is None:
        return res, r64err
    try:
        mod = next(iter(mods.values()))[0]
        kg_, sm_, th = gpu.func(mod, "kv_gather"), gpu.func(mod, "softmax_causal"), gpu.func(mod, "to_f16")
        kg = torch.empty(kv_len, kvd, dtype=torch.float16, device=dev)
        vg = torch.empty_like(kg)
        qh = torch.empty(m, qd, dtype=torch.float16, device=dev)
        ldmax = -(-kv_len // 8) * 8
        S = torch.empty(nh * min(ATT_BLOCK_ROWS, m) * ldmax, device=dev)
        P = torch.empty(nh * min(ATT_BLOCK_ROWS, m) * ldmax, dtype=torch.float16, device=dev)
        att = torch.full((m, qd), float("nan"), device=dev)

        def base():
            gpu.launch(kg_, (kv_len,), 128, [kc, vc, table, kg, vg])
            gpu.launch(th, (-(-m * qd // 1024),), 256, [q, qh, m * qd])
            i0 = 0
            while i0 < m:
                nb = min(ATT_BLOCK_ROWS, m - i0)
                kv = start + i0 + nb
                ld = -(-kv // 8) * 8
                for g in range(nkv):
                    gpu.gemm(1, 0, kv, nb, d, scale, kg.data_ptr() + g * d * 2, 2, kvd, 0,
                             qh.data_ptr() + (i0 * qd + g * group * d) * 2, 2, qd, d,
                             S.data_ptr() + g * group * nb * ld * 4, 0, ld, nb * ld, group)
                gpu.launch(sm_, (nb, nh), 256, [S, P, ld, start + i0])
                for g in range(nkv):
                    gpu.gemm(0, 0, d, nb, kv, 1.0, vg.data_ptr() + g * d * 2, 2, kvd, 0,
                             P.data_ptr() + g * group * nb * ld * 2, 2, ld, nb * ld,
                             att.data_ptr() + (i0 * qd + g * group * d) * 4, 0, qd, d, group)
                i0 += nb

        base()
        torch.cuda.synchronize()
        e = err(att)
        for w, o in outs.items():
            diff = (o - att).abs().max().item() if torch.isfinite(o).all() else float("nan")
            res.append((f"  flash w{w} vs GEMM path: max abs diff {diff:.3e}", None, None))
        res.append(("GEMM path (cuBLAS + softmax_causal)", e, timed(torch, base)))
    except RuntimeError as e:  # kernels.cu without kv_gather / softmax_causal: pass --kernels of main before
        res.append((f"GEMM path skipped: {e}", None, None))
    return res, r64err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flash", default=os.path.join(CUDA_DIR, "flash_attention.cu"))
    ap.add_argument("--kernels", default=os.path.join(CUDA_DIR, "kernels.cu"), help="kernels.cu (prelude.cu beside it)")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--qscale", type=float, default=2.0, help="std of the queries (scores' std ~ qscale)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="only the small cases")
    ap.add_argument("--tol", type=float, default=5e-3, help="max abs error allowed against the f32 reference")
    args = ap.parse_args()
    nvrtc = find_lib(["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"],
                     ["nvidia/cu13/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "libnvrtc.so.*"])
    ver = (ctypes.c_int(), ctypes.c_int())
    nvrtc.nvrtcVersion(ctypes.byref(ver[0]), ctypes.byref(ver[1]))
    print(f"NVRTC {ver[0].value}.{ver[1].value}")
    warps = [int(w) for w in args.warps.split(",")]
    # (heads, KV heads, head_dim): the 1.5B, the 32B, the 0.5B, and a head_dim-256 model (Qwen3.5's).
    shapes = [(12, 2, 128), (40, 8, 128), (14, 2, 64), (16, 2, 256)]
    chunks = {
        (12, 2, 128): [(4096, 0), (4096, 12170), (74, 16192), (16384, 0), (17, 4096), (300, 1000)],
        (40, 8, 128): [(4096, 0), (4096, 12170), (74, 16192)],
        (14, 2, 64): [(4096, 0), (74, 16192), (129, 70)],
        (16, 2, 256): [(1024, 0), (74, 5000)],
    }
    if args.quick:
        chunks = {k: [c for c in v if c[0] * (c[0] + c[1]) <= 4096 * 4096] for k, v in chunks.items()}
    compiled = {}
    for sh in shapes:
        for w in warps:
            t0 = time.time()
            src = source(*sh, w, args.kernels, args.flash)
            cubin, log = nvrtc_compile(nvrtc, src, verbose=True)
            compiled[(sh, w)] = cubin
            print(f"heads {sh[0]}/{sh[1]} d {sh[2]} warps {w}: compiled in {time.time() - t0:.1f} s")
            lines = log.splitlines()
            for i, ln in enumerate(lines):
                if "Compiling entry function 'flash_" in ln:
                    print("   ", " | ".join(x.strip() for x in lines[i:i + 4]))
    if args.compile_only:
        return
    import torch

    gpu = Gpu(torch)
    print(f"device {torch.cuda.get_device_name()}; qscale {args.qscale}; tolerance {args.tol:g}")
    fails = 0
    summary = []
    for sh in shapes:
        mods = {}
        for w in warps:
            mod = gpu.load(compiled[(sh, w)])
            mods[w] = (mod, gpu.func(mod, "flash_attention"), gpu.func(mod, "flash_combine"), None, None)
        for m, start in chunks[sh]:
            res, r64 = case(torch, gpu, mods, *sh, m, start, args)
            print(f"== heads {sh[0]}/{sh[1]} d {sh[2]}, {m} rows at {start} (f32 reference vs f64: {r64:.2e})")
            for name, e, t in res:
                if e is None:
                    print(name)
                    continue
                bad = name.startswith("flash") and not (e[0] <= args.tol)
                fails += bad
                print(f"  {name:44s} max abs err {e[0]:.3e}  rel {e[1]:.3e}  {t:9.3f} ms{'  FAIL' if bad else ''}")
                summary.append((sh, m, start, name.split(" (")[0], t))
            torch.cuda.empty_cache()
    print("summary (ms per layer's attention):")
    for sh, m, start, name, t in summary:
        print(f"  {sh[0]}/{sh[1]} d{sh[2]} {m}@{start}: {name} {t:.3f}")
    print(f"{'FAIL' if fails else 'PASS'}: {fails} flash case(s) over tolerance")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
