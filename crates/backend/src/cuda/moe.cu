// The expert-routed FFN of the fused runner (models/cuda/layer.rs, prefill.rs), after kernels.cu and experts.cu:
// the router's product on the matrix-vector kernels, its softmax and top-k (moe_route) and the assignments sorted by
// expert (moe_group, with the used experts' list and each assignment's row), then grouped products whose blocks
// each take one used expert (block row s: the s-th expert some row picked, `used`) and read its weight rows once
// for every assignment that picked it, over the input rows gathered in expert order (quant_q8 / rms_norm with a
// row table), the dot products kernels.cu's dense products use (unit<T> on f32 activations, RowQ on 8-bit ones).
// The launch shapes depend on the batch's row count only (every block row past the used experts exits), so a pass
// is captured once as a CUDA graph and replays with the routing on the device.
//
// A row's result does not depend on the other rows: each product is a weight row's sum over one input row in the
// order of its shape, whatever tile it sits in, and the mix adds a row's slots in the router's order.

// moe_route and moe_group (experts.cu) after the kernel before them.
extern "C" __global__ void moe_route_pdl(const float* __restrict__ logits, int ne, int k, int norm,
                                         u32* __restrict__ pick_e, float* __restrict__ pick_w) { PDL_ENTER
    moe_route_body(logits, ne, k, norm, pick_e, pick_w);
}
extern "C" __global__ void moe_group_pdl(const u32* __restrict__ pick_e, int n, int ne, int k,
                                         u32* __restrict__ offsets, u32* __restrict__ order, u32* __restrict__ at,
                                         u32* __restrict__ tok, u32* __restrict__ used) { PDL_ENTER
    moe_group_body(pick_e, n, ne, k, offsets, order, at, tok, used);
}

// The expert of block row s (used[1 + s]) and its assignments [p0, p1); false past the used experts.
__device__ __forceinline__ bool moe_slot(const u32* __restrict__ used, const u32* __restrict__ offsets, int s, int& e,
                                         int& p0, int& p1) {
    if (s >= (int)used[0]) return false;
    e = (int)used[1 + s];
    p0 = (int)offsets[e];
    p1 = (int)offsets[e + 1];
    return true;
}

// Y[p, n] = W_e[n] . X[p] for each assignment p of block row blockIdx.y's expert e, on f32 activations (X: the rows
// in expert order); expert e's row n is row e * stride + n of W. GU: Y[p, n] = silu(W_e[n] . X[p]) * (U_e[n] . X[p])
// with U_e[n] at the same row of U. One warp per row n, 4 per block; MR assignments per pass over the weights.
template <int T, int K, int MR, bool GU>
__device__ __forceinline__ void moe_mmv_body(const u8* __restrict__ W, const u8* __restrict__ U, int stride,
                                             const float* __restrict__ X, const u32* __restrict__ used,
                                             const u32* __restrict__ offsets, float* __restrict__ Y, int N) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 4 + (threadIdx.x >> 5);
    pdl_wait();
    int e, p0, p1;
    if (n >= N || !moe_slot(used, offsets, blockIdx.y, e, p0, p1)) return;
    const size_t row_bytes = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    const u8* rw = W + ((size_t)e * stride + n) * row_bytes;
    const u8* ru = GU ? U + ((size_t)e * stride + n) * row_bytes : rw;
    for (int t0 = p0; t0 < p1; t0 += MR) {
        const int m = min(MR, p1 - t0);
        const float* xt = X + (size_t)t0 * K;
        float aw[MR], au[MR];
#pragma unroll
        for (int r = 0; r < MR; r++) aw[r] = au[r] = 0.f;
        for (int u = lane; u < K / 32; u += 32) {
            float w[32], v[32];
            const int off = unit<T>(rw, u, w, K / 256);
            if (GU) unit<T>(ru, u, v, K / 256);
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r < m) {
                    const float4* x0 = (const float4*)(xt + (size_t)r * K + off);
                    const float4* x1 = (const float4*)(xt + (size_t)r * K + off + Fmt<T>::DOFF);
                    float s = 0.f, su = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float4 a = x0[i], c = x1[i];
                        s += w[4 * i] * a.x + w[4 * i + 1] * a.y + w[4 * i + 2] * a.z + w[4 * i + 3] * a.w;
                        s += w[16 + 4 * i] * c.x + w[16 + 4 * i + 1] * c.y + w[16 + 4 * i + 2] * c.z +
                             w[16 + 4 * i + 3] * c.w;
                        if (GU) {
                            su += v[4 * i] * a.x + v[4 * i + 1] * a.y + v[4 * i + 2] * a.z + v[4 * i + 3] * a.w;
                            su += v[16 + 4 * i] * c.x + v[16 + 4 * i + 1] * c.y + v[16 + 4 * i + 2] * c.z +
                                  v[16 + 4 * i + 3] * c.w;
                        }
                    }
                    aw[r] += s;
                    au[r] += su;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < m) {
                const float g = warp_sum(aw[r]);
                const float up = GU ? warp_sum(au[r]) : 0.f;
                if (lane == 0) Y[(size_t)(t0 + r) * N + n] = GU ? g / (1.f + __expf(-g)) * up : g;
            }
        }
    }
}

// The same on 8-bit activations (Xq, Xd: quant_q8 of the rows in expert order): P <= 32 threads per weight row,
// 128 / P rows per block, each thread's pairs of the row loaded once and used for every assignment of the expert.
template <int T, int K, int MR, int P, bool GU>
__device__ __forceinline__ void moe_mmvq_body(const u8* __restrict__ W, const u8* __restrict__ U, int stride,
                                              const i8* __restrict__ Xq, const float2* __restrict__ Xd,
                                              const u32* __restrict__ used, const u32* __restrict__ offsets,
                                              float* __restrict__ Y, int N) {
    static_assert(P <= 32, "one warp per weight row at most");
    const int tid = threadIdx.x;
    const int n = blockIdx.x * (128 / P) + tid / P, part = tid % P;
    pdl_wait();
    int e, p0, p1;
    if (!moe_slot(used, offsets, blockIdx.y, e, p0, p1)) return;
    const size_t rb = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    const size_t row = (size_t)e * stride + min(n, N - 1);
    RowQ<T, K, P> g, u;
    g.load(W + row * rb, part);
    if (GU) u.load(U + row * rb, part);
    for (int t0 = p0; t0 < p1; t0 += MR) {
        const int m = min(MR, p1 - t0);
        const i8* xq = Xq + (size_t)t0 * K;
        const float2* xd = Xd + (size_t)t0 * (K / 32);
        float a[MR], c[MR];
        if (GU) g.template dot2<MR>(u, part, xq, xd, m, a, c);
        else g.template dot<MR>(part, xq, xd, m, a);
        if (part == 0 && n < N) {
#pragma unroll
            for (int r = 0; r < MR; r++)
                if (r < m) Y[(size_t)(t0 + r) * N + n] = GU ? a[r] / (1.f + __expf(-a[r])) * c[r] : a[r];
        }
    }
}

// x[t] += sum over the slots j of row t, in order, of pick_w[t * k + j] * y[at[t * k + j]] (rows of HIDDEN). One
// block per row.
extern "C" __global__ void moe_mix_add(const float* __restrict__ y, const u32* __restrict__ at,
                                       const float* __restrict__ pick_w, int k, float* __restrict__ x) { PDL_ENTER
    const int t = blockIdx.x;
    for (int o = threadIdx.x; o < HIDDEN; o += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += pick_w[(size_t)t * k + j] * y[(size_t)at[(size_t)t * k + j] * HIDDEN + o];
        x[(size_t)t * HIDDEN + o] += acc;
    }
}

// The tensor-core path's SwiGLU: out[p, j] = f16(silu(gu[p, j]) * gu[p, f + j]) for p < n, j < f (gu: rows of 2f,
// gate then up).
extern "C" __global__ void moe_silu_f16(const float* __restrict__ gu, int f, int n, u16* __restrict__ out) {
    PDL_ENTER
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * f) return;
    const size_t p = i / f, j = i % f;
    const float g = gu[p * 2 * f + j], u = gu[p * 2 * f + f + j];
    out[i] = f2h(fminf(fmaxf(g / (1.f + __expf(-g)) * u, -65504.f), 65504.f));
}
