// Splash CUDA kernels. The host prepends a block of #defines with the model's constants (HIDDEN, HEAD_DIM, ...)
// and appends the explicit instantiations this model needs, so every loop bound below is a compile-time constant.
// No headers: NVRTC compiles this as is; f16 conversions use PTX.

#define WARP 32

__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}


// Programmatic dependent launch (Hopper): with the launch attribute set by the host, a kernel may start while the
// previous one drains; `pdl_wait` blocks until that one has finished and its writes are visible, so every kernel calls
// it before touching activations (weights, which no kernel writes, may be prefetched before it). `pdl_trigger` lets
// the next kernel's blocks be scheduled once every block of this one has started. Both are no-ops without the
// attribute and before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
#define PDL_ENTER pdl_trigger(); pdl_wait();
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 byte_of(u32 w, int k) { return (w >> (8 * k)) & 0xFF; }
// Bytes 0..63 minus 32 each (no borrow between bytes).
__device__ __forceinline__ int sub32x4(u32 v) { return (int)(((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u); }

// Layout of 8-bit activation rows (K a multiple of 64). XPERM: the row's 16-byte chunks are permuted so that chunk
// c sits at (c % 4) * (K / 64) + c / 4: the k-th 16 bytes of consecutive 64-value pairs are neighbours, so when
// the lanes of a warp take consecutive pairs (the 8-bit matrix-vector kernels), each of their four 16-byte loads reads
// 512 contiguous bytes (4 L1 wavefronts) instead of 16 bytes every 64 (16 wavefronts). Same values, same sums.
__device__ __forceinline__ int xpos(int a, int K) {
#if XPERM
    const int c = a >> 4;
    return ((c & 3) * (K >> 6) + (c >> 2)) * 16 + (a & 15);
#else
    return a;
#endif
}
// 16-byte chunk c (values 16c .. 16c + 15) of an activation row of K values.
template <int K> __device__ __forceinline__ int4 xchunk(const i8* xr, int c) {
#if XPERM
    return *(const int4*)(xr + ((c & 3) * (K / 64) + (c >> 2)) * 16);
#else
    return *(const int4*)(xr + c * 16);
#endif
}

// Quantizes v (element `lane` of the 32-block starting at value a0 of the activation row qrow of K values) into
// that row (layout: xpos) and ds.
__device__ __forceinline__ void q8_block(float v, i8* qrow, int a0, int K, float2* ds) {
    const int lane = threadIdx.x & 31;
    const float amax = warp_max(fabsf(v));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    const int qi = (int)rintf(v * id);
    int s = qi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    qrow[xpos(a0 + lane, K)] = (i8)qi;
    if (lane == 0) {
        const float d = amax / 127.f;
        *ds = make_float2(d, d * (float)s);
    }
}


// ---- Quant formats: each row is split into units of 32 weights. A unit's weights w[0..16) multiply
// x[off .. off+16) and w[16..32) multiply x[off+DOFF .. off+DOFF+16).

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q6_K 14

template <int T> struct Fmt;
template <> struct Fmt<T_F32> { static const int BLOCK = 32, BYTES = 128, DOFF = 16; };
template <> struct Fmt<T_F16> { static const int BLOCK = 32, BYTES = 64, DOFF = 16; };
template <> struct Fmt<T_Q4_0> { static const int BLOCK = 32, BYTES = 18, DOFF = 16; };
template <> struct Fmt<T_Q4_1> { static const int BLOCK = 32, BYTES = 20, DOFF = 16; };
// Q5_0 and Q8_0 blocks are repacked on upload too: {d, 2 zero bytes, qh, qs} (24 bytes) and {d, 2 zero bytes, qs}
// (36 bytes), so their bit and quant fields are 4-byte aligned.
template <> struct Fmt<T_Q5_0> { static const int BLOCK = 32, BYTES = 24, DOFF = 16; };
template <> struct Fmt<T_Q5_1> { static const int BLOCK = 32, BYTES = 24, DOFF = 16; };
template <> struct Fmt<T_Q8_0> { static const int BLOCK = 32, BYTES = 36, DOFF = 16; };
template <> struct Fmt<T_Q4_K> { static const int BLOCK = 256, BYTES = 144, DOFF = 32; };
// Q6_K blocks are repacked on upload from 210 to 224 bytes (same field offsets, zero padding at the end), so every
// block starts 16-byte aligned and its fields load as 16-byte vectors.
template <> struct Fmt<T_Q6_K> { static const int BLOCK = 256, BYTES = 224, DOFF = 64; };

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float& d, float& m) {
    if (j < 4) {
        d = (float)(q[j] & 63);
        m = (float)(q[j + 4] & 63);
    } else {
        d = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Dequantizes unit `u` of a row starting at `row`; returns the offset of its first half.
template <int T> __device__ __forceinline__ int unit(const u8* row, int u, float* w, int nsb);

template <> __device__ __forceinline__ int unit<T_F32>(const u8* row, int u, float* w, int nsb) {
    const float4* p = (const float4*)(row + u * 128);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = p[i];
        w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_F16>(const u8* row, int u, float* w, int nsb) {
    const uint4* p = (const uint4*)(row + u * 64);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint4 v = p[i];
        u32 a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[8 * i + 2 * k] = h2f((u16)(a[k] & 0xFFFF));
            w[8 * i + 2 * k + 1] = h2f((u16)(a[k] >> 16));
        }
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q4_0>(const u8* row, int u, float* w, int nsb) {
    const u8* b = row + u * 18;
    float d = h2f(ld16(b));
#pragma unroll
    for (int j = 0; j < 8; j++) {
        u16 q = ld16(b + 2 + 2 * j);
        w[2 * j] = d * (float)((int)(q & 0xF) - 8);
        w[2 * j + 1] = d * (float)((int)((q >> 8) & 0xF) - 8);
        w[16 + 2 * j] = d * (float)((int)((q >> 4) & 0xF) - 8);
        w[16 + 2 * j + 1] = d * (float)((int)(q >> 12) - 8);
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q4_1>(const u8* row, int u, float* w, int nsb) {
    const u8* b = row + u * 20;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
    const u32* qs = (const u32*)(b + 4);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 q = qs[j];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 byte = (q >> (8 * k)) & 0xFF;
            w[4 * j + k] = d * (float)(byte & 0xF) + m;
            w[16 + 4 * j + k] = d * (float)(byte >> 4) + m;
        }
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q5_0>(const u8* row, int u, float* w, int nsb) {
    const u8* b = row + u * 24;
    float d = h2f(ld16(b));
    u32 qh = *(const u32*)(b + 4);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        u16 q = ld16(b + 8 + 2 * j);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int jj = 2 * j + k;
            u32 byte = (q >> (8 * k)) & 0xFF;
            int x0 = (int)((byte & 0xF) | (((qh >> jj) & 1) << 4)) - 16;
            int x1 = (int)((byte >> 4) | (((qh >> (jj + 16)) & 1) << 4)) - 16;
            w[jj] = d * (float)x0;
            w[16 + jj] = d * (float)x1;
        }
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q5_1>(const u8* row, int u, float* w, int nsb) {
    const u8* b = row + u * 24;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
    u32 qh = *(const u32*)(b + 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u32 byte = b[8 + j];
        w[j] = d * (float)((byte & 0xF) | (((qh >> j) & 1) << 4)) + m;
        w[16 + j] = d * (float)((byte >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q8_0>(const u8* row, int u, float* w, int nsb) {
    const u8* b = row + u * 36;
    float d = h2f(ld16(b));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u16 q = ld16(b + 4 + 2 * j);
        w[2 * j] = d * (float)(i8)(q & 0xFF);
        w[2 * j + 1] = d * (float)(i8)(q >> 8);
    }
    return u * 32;
}
template <> __device__ __forceinline__ int unit<T_Q4_K>(const u8* row, int u, float* w, int nsb) {
    int sub = u & 7, j = sub >> 1, h = sub & 1;
#if REPACK
    const u8* b = row + nsb * 128 + (u >> 3) * 16;
    const u8* qp = row + (h ? nsb * 64 : 0) + 16 * ((u >> 3) * 4 + j);
#else
    const u8* b = row + (u >> 3) * 144;
    const u8* qp = b + 16 + 32 * j + 16 * h;
#endif
    float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
    float s0, m0, s1, m1;
    scale_min_k4(2 * j, b + 4, s0, m0);
    scale_min_k4(2 * j + 1, b + 4, s1, m1);
    float d0 = d * s0, mm0 = dmin * m0, d1 = d * s1, mm1 = dmin * m1;
    uint4 q = *(const uint4*)qp;
    u32 a[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 byte = (a[i] >> (8 * k)) & 0xFF;
            w[4 * i + k] = d0 * (float)(byte & 0xF) - mm0;
            w[16 + 4 * i + k] = d1 * (float)(byte >> 4) - mm1;
        }
    }
    return (u >> 3) * 256 + 64 * j + 16 * h;
}
template <> __device__ __forceinline__ int unit<T_Q6_K>(const u8* row, int u, float* w, int nsb) {
    int sub = u & 7, hf = sub >> 2, pp = (sub >> 1) & 1, lg = sub & 1;
#if REPACK
    const int sb = u >> 3;
    const u8* ql = row + (lg ? nsb * 64 : 0) + 16 * (sb * 4 + hf * 2 + pp);
    const u8* qh = row + nsb * (lg ? 160 : 128) + 16 * (sb * 2 + hf);
    const i8* sc = (const i8*)(row + nsb * 192 + 16 * sb);
    float d = h2f(ld16(row + nsb * 208 + 2 * sb));
#else
    const u8* b = row + (u >> 3) * Fmt<T_Q6_K>::BYTES;
    const u8* ql = b + 64 * hf + 32 * pp + 16 * lg;
    const u8* qh = b + 128 + 32 * hf + 16 * lg;
    const i8* sc = (const i8*)(b + 192);
    float d = h2f(ld16(b + 208));
#endif
    float dlo = d * (float)sc[8 * hf + lg + 2 * pp], dhi = d * (float)sc[8 * hf + lg + 4 + 2 * pp];
    int shl = 2 * pp, shh = 4 + 2 * pp;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u16 l2 = ld16(ql + 2 * i), h2 = ld16(qh + 2 * i);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            u32 lb = (l2 >> (8 * k)) & 0xFF, hb = (h2 >> (8 * k)) & 0xFF;
            int lo = (int)((lb & 0xF) | (((hb >> shl) & 3) << 4)) - 32;
            int hi = (int)((lb >> 4) | (((hb >> shh) & 3) << 4)) - 32;
            w[2 * i + k] = dlo * (float)lo;
            w[16 + 2 * i + k] = dhi * (float)hi;
        }
    }
    return (u >> 3) * 256 + 128 * hf + 32 * pp + 16 * lg;
}

// ---- Matrix times a few rows: Y[r, n] (+)= sum_k W[n, k] X[r, k] (+ bias[n]) for r < m <= MR.
// One warp per output row n; every weight is read once for all m rows. MODE 0: store, 1: add to Y (residual).

// WPR warps share each row (split over K, reduced through shared memory): long rows (FFN down) get more loads in
// flight per row. Blocks hold 4 warps: 4 / WPR rows per block.
template <int T, int K, int MR, int MODE, int WPR>
__device__ __forceinline__ void mmv_body(const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y,
                                         const float* __restrict__ bias, int m, int N) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int n = blockIdx.x * (4 / WPR) + wid / WPR;
    const int part = wid % WPR;
    X += (size_t)blockIdx.y * MR * K;
    Y += (size_t)blockIdx.y * MR * N;
    m = min(m - (int)blockIdx.y * MR, MR);
    const int NU = K / 32;
    const size_t row_bytes = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    const u8* row = W + (size_t)min(n, N - 1) * row_bytes;
    if (n < N)
        for (size_t l = part * 32 + lane; l * 128 < row_bytes; l += 32 * WPR) prefetch_l2(row + l * 128);
    pdl_wait();
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.f;
    if (n < N) {
#pragma unroll 2
        for (int u = part * 32 + lane; u < NU; u += 32 * WPR) {
            float w[32];
            int off = unit<T>(row, u, w, K / 256);
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r < m) {
                    const float4* x0 = (const float4*)(X + (size_t)r * K + off);
                    const float4* x1 = (const float4*)(X + (size_t)r * K + off + Fmt<T>::DOFF);
                    float s = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float4 a = x0[i], c = x1[i];
                        s += w[4 * i] * a.x + w[4 * i + 1] * a.y + w[4 * i + 2] * a.z + w[4 * i + 3] * a.w;
                        s += w[16 + 4 * i] * c.x + w[16 + 4 * i + 1] * c.y + w[16 + 4 * i + 2] * c.z +
                             w[16 + 4 * i + 3] * c.w;
                    }
                    acc[r] += s;
                }
            }
        }
    }
    __shared__ float red[4][MR];
#pragma unroll
    for (int r = 0; r < MR; r++) {
        float v = warp_sum(acc[r]);
        if (WPR > 1) {
            if (lane == 0) red[wid][r] = v;
        } else if (lane == 0 && r < m && n < N) {
            if (bias) v += bias[n];
            if (MODE == 1) Y[(size_t)r * N + n] += v;
            else Y[(size_t)r * N + n] = v;
        }
    }
    if (WPR > 1) {
        __syncthreads();
        if (part == 0 && lane == 0 && n < N) {
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r < m) {
                    float v = 0.f;
                    for (int p = 0; p < WPR; p++) v += red[wid + p][r];
                    if (bias) v += bias[n];
                    if (MODE == 1) Y[(size_t)r * N + n] += v;
                    else Y[(size_t)r * N + n] = v;
                }
            }
        }
    }
}

// One weight row against up to MR activation rows, RMS-normalising each activation row on the fly
// (x -> x * g * rsqrt(mean(x^2) + eps); every element of x passes through the warp exactly once, so the sum of
// squares comes free with the dot product). Returns the full sums in every lane.
template <int T, int K, int MR>
__device__ __forceinline__ void row_dot(const u8* __restrict__ row, const float* __restrict__ X,
                                        const float* __restrict__ g, int m, float* out) {
    const int lane = threadIdx.x & 31;
    const int NU = K / 32;
    float acc[MR], ss[MR];
#pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = ss[r] = 0.f;
#pragma unroll 2
    for (int u = lane; u < NU; u += 32) {
        float w[32];
        int off = unit<T>(row, u, w, K / 256);
        // Weights times the norm weights of their columns.
        const float4* g0 = (const float4*)(g + off);
        const float4* g1 = (const float4*)(g + off + Fmt<T>::DOFF);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 a = g0[i], c = g1[i];
            w[4 * i] *= a.x; w[4 * i + 1] *= a.y; w[4 * i + 2] *= a.z; w[4 * i + 3] *= a.w;
            w[16 + 4 * i] *= c.x; w[16 + 4 * i + 1] *= c.y; w[16 + 4 * i + 2] *= c.z; w[16 + 4 * i + 3] *= c.w;
        }
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < m) {
                const float4* x0 = (const float4*)(X + (size_t)r * K + off);
                const float4* x1 = (const float4*)(X + (size_t)r * K + off + Fmt<T>::DOFF);
                float s = 0.f, q = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 a = x0[i], c = x1[i];
                    s += w[4 * i] * a.x + w[4 * i + 1] * a.y + w[4 * i + 2] * a.z + w[4 * i + 3] * a.w;
                    s += w[16 + 4 * i] * c.x + w[16 + 4 * i + 1] * c.y + w[16 + 4 * i + 2] * c.z +
                         w[16 + 4 * i + 3] * c.w;
                    q += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + c.x * c.x + c.y * c.y + c.z * c.z + c.w * c.w;
                }
                acc[r] += s;
                ss[r] += q;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        float v = warp_sum(acc[r]);
        v *= rsqrtf(warp_sum(ss[r]) / (float)K + RMS_EPS);
        out[r] = v;
    }
}

// Q, K and V projections in one launch, with the attention RMSNorm fused: blocks cover the rows of wq, then wk,
// then wv (4 rows per block), each with its bias.
template <int TQ, int TK, int TV, int MR>
__device__ __forceinline__ void qkv_body(const u8* Wq, const u8* Wk, const u8* Wv, const float* X, const float* g,
                                         const float* bq, const float* bk, const float* bv, float* q, float* k,
                                         float* v, int m) {
    const int lane = threadIdx.x & 31;
    int n = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    X += (size_t)blockIdx.y * MR * HIDDEN;
    const size_t r0 = (size_t)blockIdx.y * MR;
    m = min(m - (int)blockIdx.y * MR, MR);
    float out[MR];
    float* Y;
    int N;
    const float* b;
    if (n < Q_DIM) {
        row_dot<TQ, HIDDEN, MR>(Wq + (size_t)n * (HIDDEN / Fmt<TQ>::BLOCK) * Fmt<TQ>::BYTES, X, g, m, out);
        Y = q; N = Q_DIM; b = bq;
    } else if (n < Q_DIM + KV_DIM) {
        n -= Q_DIM;
        row_dot<TK, HIDDEN, MR>(Wk + (size_t)n * (HIDDEN / Fmt<TK>::BLOCK) * Fmt<TK>::BYTES, X, g, m, out);
        Y = k; N = KV_DIM; b = bk;
    } else if (n < Q_DIM + 2 * KV_DIM) {
        n -= Q_DIM + KV_DIM;
        row_dot<TV, HIDDEN, MR>(Wv + (size_t)n * (HIDDEN / Fmt<TV>::BLOCK) * Fmt<TV>::BYTES, X, g, m, out);
        Y = v; N = KV_DIM; b = bv;
    } else {
        return;
    }
    if (lane == 0) {
        const float bias = b ? b[n] : 0.f;
#pragma unroll
        for (int r = 0; r < MR; r++)
            if (r < m) Y[(r0 + r) * N + n] = out[r] + bias;
    }
}

// Gate and up projections together, writing silu(gate) * up.
template <int T, int K, int MR>
__device__ __forceinline__ void mmv_gu_body(const u8* __restrict__ Wg, const u8* __restrict__ Wu,
                                            const float* __restrict__ X, float* __restrict__ Y, int m, int N) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (n >= N) return;
    X += (size_t)blockIdx.y * MR * K;
    Y += (size_t)blockIdx.y * MR * N;
    m = min(m - (int)blockIdx.y * MR, MR);
    const int NU = K / 32;
    const size_t row_bytes = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    const u8* rg = Wg + (size_t)n * row_bytes;
    const u8* ru = Wu + (size_t)n * row_bytes;
    for (size_t l = lane; l * 128 < row_bytes; l += 32) {
        prefetch_l2(rg + l * 128);
        prefetch_l2(ru + l * 128);
    }
    pdl_wait();
    float ag[MR], au[MR];
#pragma unroll
    for (int r = 0; r < MR; r++) ag[r] = au[r] = 0.f;
    for (int u = lane; u < NU; u += 32) {
        float wg[32], wu[32];
        int off = unit<T>(rg, u, wg, K / 256);
        unit<T>(ru, u, wu, K / 256);
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < m) {
                const float4* x0 = (const float4*)(X + (size_t)r * K + off);
                const float4* x1 = (const float4*)(X + (size_t)r * K + off + Fmt<T>::DOFF);
                float sg = 0.f, su = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 a = x0[i], c = x1[i];
                    sg += wg[4 * i] * a.x + wg[4 * i + 1] * a.y + wg[4 * i + 2] * a.z + wg[4 * i + 3] * a.w;
                    sg += wg[16 + 4 * i] * c.x + wg[16 + 4 * i + 1] * c.y + wg[16 + 4 * i + 2] * c.z +
                          wg[16 + 4 * i + 3] * c.w;
                    su += wu[4 * i] * a.x + wu[4 * i + 1] * a.y + wu[4 * i + 2] * a.z + wu[4 * i + 3] * a.w;
                    su += wu[16 + 4 * i] * c.x + wu[16 + 4 * i + 1] * c.y + wu[16 + 4 * i + 2] * c.z +
                          wu[16 + 4 * i + 3] * c.w;
                }
                ag[r] += sg;
                au[r] += su;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) {
            const float g = warp_sum(ag[r]), up = warp_sum(au[r]);
            if (lane == 0) Y[(size_t)r * N + n] = g / (1.f + __expf(-g)) * up;
        }
    }
}

// Rows of a quantized matrix (token embedding), dequantized: out[t, :] = W[tokens[t], :].
template <int T, int K>
__device__ __forceinline__ void embed_body(const u8* __restrict__ W, const u32* __restrict__ tokens,
                                           float* __restrict__ out) {
    const int t = blockIdx.x;
    const size_t row_bytes = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    const u8* row = W + (size_t)tokens[t] * row_bytes;
    for (int u = threadIdx.x; u < K / 32; u += blockDim.x) {
        float w[32];
        int off = unit<T>(row, u, w, K / 256);
        float* o = out + (size_t)t * K;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            o[off + i] = w[i];
            o[off + Fmt<T>::DOFF + i] = w[16 + i];
        }
    }
}

// ---- Per-row operations (block of 256 threads per row).

__device__ __forceinline__ float block_sum(float v, float* sh) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += sh[i];
    return s;
}

// out[i, :] = x[rows ? rows[i] : i, :] * rsqrt(mean(x^2) + eps) * w
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                    const u32* __restrict__ rows) { PDL_ENTER
    __shared__ float sh[32];
    const int i = blockIdx.x;
    const float* xr = x + (size_t)(rows ? rows[i] : i) * HIDDEN;
    float s = 0.f;
    for (int k = threadIdx.x; k < HIDDEN; k += blockDim.x) s += xr[k] * xr[k];
    s = block_sum(s, sh);
    const float scale = rsqrtf(s / (float)HIDDEN + RMS_EPS);
    for (int k = threadIdx.x; k < HIDDEN; k += blockDim.x) out[(size_t)i * HIDDEN + k] = xr[k] * scale * w[k];
}

extern "C" __global__ void silu_mul(float* __restrict__ g, const float* __restrict__ u, int n) { PDL_ENTER
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = g[i];
        g[i] = a / (1.f + __expf(-a)) * u[i];
    }
}

// Per-head RMSNorm of q and k (qwen3), in place; one warp per head.
extern "C" __global__ void qk_norm(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ qw,
                                   const float* __restrict__ kw) { PDL_ENTER
    const int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int h = wid; h < NUM_HEADS + NUM_KV_HEADS; h += blockDim.x >> 5) {
        float* v = h < NUM_HEADS ? q + (size_t)t * Q_DIM + h * HEAD_DIM
                                 : k + (size_t)t * KV_DIM + (h - NUM_HEADS) * HEAD_DIM;
        const float* w = h < NUM_HEADS ? qw : kw;
        float s = 0.f;
        for (int i = lane; i < HEAD_DIM; i += 32) s += v[i] * v[i];
        s = warp_sum(s);
        float scale = rsqrtf(s / (float)HEAD_DIM + RMS_EPS);
        for (int i = lane; i < HEAD_DIM; i += 32) v[i] = v[i] * scale * w[i];
    }
}

// Rotation pair i (0 <= i < HEAD_DIM / 2) of a head: the two dimensions RoPE turns together (NEOX: i and i + half;
// else 2i and 2i + 1); pairs past ROPE_DIM / 2 are 2i, 2i + 1 and keep their values.
__device__ __forceinline__ void rope_pair(int i, int& ia, int& ib) {
    const int half = ROPE_DIM / 2;
    if (i < half && ROPE_NEOX) { ia = i; ib = i + half; } else { ia = 2 * i; ib = 2 * i + 1; }
}
// (x0, x1) of pair i rotated for position p (unchanged past ROPE_DIM / 2). rope_kv and the QKV kernel's fused epilogue
// both call this, so the two give the same bits.
__device__ __forceinline__ void rope_rot(float x0, float x1, u32 p, const float* __restrict__ inv_freq, int i,
                                         float& a, float& b) {
    if (i < ROPE_DIM / 2) {
        float s, c;
        sincosf((float)p * inv_freq[i], &s, &c);
        a = x0 * c - x1 * s;
        b = x0 * s + x1 * c;
    } else {
        a = x0;
        b = x1;
    }
}

// RoPE on q and k of row t (at position pos[t]), then k and v (f16) into the paged cache.
// Cache layout per layer: [page][PAGE_SIZE][KV_DIM]; the row's page is table[slot[t] * MAX_PAGES + pos / PAGE_SIZE].
extern "C" __global__ void rope_kv(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                   const float* __restrict__ inv_freq, const u32* __restrict__ pos,
                                   const u32* __restrict__ slot, const u32* __restrict__ table,
                                   u16* __restrict__ kc, u16* __restrict__ vc) { PDL_ENTER
    const int t = blockIdx.x;
    const u32 p = pos[t];
    const u32 page = table[(size_t)slot[t] * MAX_PAGES + p / PAGE_SIZE];
    const size_t cbase = ((size_t)page * PAGE_SIZE + p % PAGE_SIZE) * KV_DIM;
    // Each thread handles one rotation pair of one head (q heads then k heads), or copies a dimension; the pairs
    // are spread over gridDim.y blocks (one pass each for the shapes the host launches).
    const int g0 = blockIdx.y * blockDim.x + threadIdx.x, gs = gridDim.y * blockDim.x;
    for (int idx = g0; idx < (NUM_HEADS + NUM_KV_HEADS) * (HEAD_DIM / 2); idx += gs) {
        const int h = idx / (HEAD_DIM / 2), i = idx % (HEAD_DIM / 2);
        const bool isq = h < NUM_HEADS;
        const float* src = isq ? q + (size_t)t * Q_DIM + h * HEAD_DIM : k + (size_t)t * KV_DIM + (h - NUM_HEADS) * HEAD_DIM;
        int ia, ib;
        rope_pair(i, ia, ib);
        float a, b;
        rope_rot(src[ia], src[ib], p, inv_freq, i, a, b);
        if (isq) {
            float* dst = q + (size_t)t * Q_DIM + h * HEAD_DIM;
            dst[ia] = a;
            dst[ib] = b;
        } else {
            u16* dst = kc + cbase + (h - NUM_HEADS) * HEAD_DIM;
            dst[ia] = f2h(a);
            dst[ib] = f2h(b);
        }
    }
    for (int i = g0; i < KV_DIM; i += gs) vc[cbase + i] = f2h(v[(size_t)t * KV_DIM + i]);
}

// Activations rounded exactly as the CPU backend (and ggml) quantize them before a quantized dot product, then
// dequantized back to f32: FMT 0 = Q8_0 / Q8_1 (32-blocks, d = amax/127 stored as f16, round half away from zero),
// FMT 1 = Q8_K (256-blocks, iscale = -127/max, round half to even, clamp 127, d = 1/iscale in f32).
// One warp per block; grid (rows, ceil(blocks_per_row / 8)), 256 threads.
template <int FMT>
__device__ __forceinline__ void act_quant_body(const float* __restrict__ x, float* __restrict__ out, int K) {
    const int BL = FMT == 0 ? 32 : 256, EL = BL / 32;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int b = blockIdx.y * 8 + wid;
    if (b * BL >= K) return;
    const size_t base = (size_t)blockIdx.x * K + (size_t)b * BL + lane * EL;
    float v[EL];
#pragma unroll
    for (int e = 0; e < EL; e++) v[e] = x[base + e];
    if (FMT == 0) {
        float amax = warp_max(fabsf(v[0]));
        float d = amax / 127.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        float dh = h2f(f2h(d));
        out[base] = dh * roundf(v[0] * id);
    } else {
        // The signed value of largest magnitude (the first one, on ties, as a serial scan finds).
        float amax = 0.f, mx = 0.f;
        int idx = 1 << 30;
#pragma unroll
        for (int e = 0; e < EL; e++) {
            float a = fabsf(v[e]);
            if (a > amax) { amax = a; mx = v[e]; idx = lane * EL + e; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
            float m2 = __shfl_xor_sync(0xffffffffu, mx, o);
            int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            if (a2 > amax || (a2 == amax && i2 < idx)) { amax = a2; mx = m2; idx = i2; }
        }
        if (amax == 0.f) {
#pragma unroll
            for (int e = 0; e < EL; e++) out[base + e] = 0.f;
            return;
        }
        float iscale = -127.f / mx;
        float d = 1.f / iscale;
#pragma unroll
        for (int e = 0; e < EL; e++) out[base + e] = d * fminf(127.f, rintf(iscale * v[e]));
    }
}
extern "C" __global__ void act_q8_0(const float* x, float* out, int K) { PDL_ENTER act_quant_body<0>(x, out, K); }
extern "C" __global__ void act_q8_k(const float* x, float* out, int K) { PDL_ENTER act_quant_body<1>(x, out, K); }

// Causal attention of row t, head h, over positions 0..=pos[t] of its sequence's paged cache, split over gridDim.z
// blocks (flash-decoding): split z takes a contiguous range of positions and writes its unnormalised partial
// (max, sum, acc[HEAD_DIM]) to part[((t * NUM_HEADS + h) * S + z) * (HEAD_DIM + 2)]; attn_combine merges them.
// Inside a split each warp takes tiles of 32 positions, one position per lane for the scores. Queries are rounded
// to f16 first, as the CPU backend does.
// CL (attention_cl, gridDim.z == ATT_CL): the splits of (t, h) are one thread-block cluster, and block 0 merges
// their partials from the blocks' shared memory (distributed shared memory, sm_90) after a cluster barrier, rather
// than the last block from global memory after a fence and a counter. The same partials merged in the same order as
// the global merge, so the same bits while the context needs at most ATT_CL splits (the host uses it only then).
#define E (HEAD_DIM / 32)
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// The float at `p` (this block's shared memory) in the shared memory of block `rank` of the cluster.
__device__ __forceinline__ float cluster_ld(const float* p, int rank) {
    float v = 0.f;
#if __CUDA_ARCH__ >= 900
    const u32 a = (u32)__cvta_generic_to_shared(p);
    u32 ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
#endif
    return v;
}
template <bool CL>
__device__ __forceinline__ void attention_body(const float* __restrict__ q, const u16* __restrict__ kc,
                                               const u16* __restrict__ vc, const u32* __restrict__ pos,
                                               const u32* __restrict__ slot, const u32* __restrict__ table,
                                               float* __restrict__ part, float* out, int* counters,
                                               i8* __restrict__ qo, float2* __restrict__ qd) {
    pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z, SG = gridDim.z;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int kvh = h / (NUM_HEADS / NUM_KV_HEADS);
    const int n = (int)pos[t] + 1;
#if ATT_DYN
    // Only the splits the context needs (at least ATT_MIN_SPLIT positions each, at most ATT_SPLITS; past
    // ATT_SPLITS x ATT_LONG positions one per ATT_LONG, as the host sized the launch) take part, in the merge too;
    // the rest leave at once (in a cluster, unless there is a merge: they take part in its barriers, with no
    // positions). Partials keep the launch's stride. A row's count depends on its own context alone.
    const int want = max(min(ATT_SPLITS, (n + ATT_MIN_SPLIT - 1) / ATT_MIN_SPLIT),
                         ATT_LONG ? (n + ATT_LONG - 1) / max(ATT_LONG, 1) : 1);
    const int S = out ? min(SG, want) : SG;
    if (z >= S && (!CL || S == 1)) return;
#else
    const int S = SG;
#endif
    const int chunk = ((n + S - 1) / S + 32 * ATT_WARPS - 1) / (32 * ATT_WARPS) * (32 * ATT_WARPS);
    const int start = z * chunk, end = z < S ? min(n, start + chunk) : start;
    const u32* tab = table + (size_t)slot[t] * MAX_PAGES;
    // The warp's first tile of K and V into L2 while the query (written by the previous kernel) is awaited and read.
    // (Positions, slots and page tables are written by the host before the launch.)
    if (start + 32 * wid + lane < end) {
        const int b0 = start + 32 * wid;
        const size_t prow = (size_t)tab[b0 / PAGE_SIZE] * PAGE_SIZE + b0 % PAGE_SIZE + lane;
        for (int o = 0; o < HEAD_DIM; o += 64) {
            prefetch_l2(kc + prow * KV_DIM + kvh * HEAD_DIM + o);
            prefetch_l2(vc + prow * KV_DIM + kvh * HEAD_DIM + o);
        }
    }
    pdl_wait();
    const float scale = rsqrtf((float)HEAD_DIM);
    __shared__ float qs[HEAD_DIM];
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], sacc[ATT_WARPS][HEAD_DIM];
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x)
        qs[i] = h2f(f2h(q[(size_t)t * Q_DIM + h * HEAD_DIM + i])) * scale;
    __syncthreads();
    float mx = -1e30f, l = 0.f, acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0.f;
    for (int base = start + 32 * wid; base < end; base += 32 * ATT_WARPS) {
        const int p = base + lane;
        // Tiles are 32-aligned and pages hold a multiple of 32 positions: one page per tile.
        const size_t prow = (size_t)tab[base / PAGE_SIZE] * PAGE_SIZE + base % PAGE_SIZE;
        const int cnt = min(32, end - base);
        const u16* vb = vc + prow * KV_DIM + kvh * HEAD_DIM + lane * E;
        // The tile's V rows (E == 4: 8 bytes per lane and row) are loaded together with K, not after the softmax.
        uint2 vt[E == 4 ? 32 : 1];
        if (E == 4) {
#pragma unroll
            for (int j = 0; j < 32; j++) vt[j] = j < cnt ? *(const uint2*)(vb + (size_t)j * KV_DIM) : make_uint2(0, 0);
        }
        float s = -1e30f;
        if (p < end) {
            const uint4* kr = (const uint4*)(kc + (prow + lane) * KV_DIM + kvh * HEAD_DIM);
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 8; i++) {
                uint4 k8 = kr[i];
                u32 a[4] = {k8.x, k8.y, k8.z, k8.w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    d += qs[8 * i + 2 * c] * h2f((u16)(a[c] & 0xFFFF));
                    d += qs[8 * i + 2 * c + 1] * h2f((u16)(a[c] >> 16));
                }
            }
            s = d;
        }
        const float tmax = warp_max(s);
        const float mn = fmaxf(mx, tmax);
        const float corr = __expf(mx - mn);
        const float pr = p < end ? __expf(s - mn) : 0.f;
        l = l * corr + warp_sum(pr);
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] *= corr;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const float pj = __shfl_sync(0xffffffffu, pr, j);
            if (j < cnt) {
                const u16* vr = vb + (size_t)j * KV_DIM;
                if (E == 4) {
                    const uint2 v4 = vt[E == 4 ? j : 0];
                    acc[0] += pj * h2f((u16)(v4.x & 0xFFFF));
                    acc[1 % E] += pj * h2f((u16)(v4.x >> 16));
                    acc[2 % E] += pj * h2f((u16)(v4.y & 0xFFFF));
                    acc[3 % E] += pj * h2f((u16)(v4.y >> 16));
                } else {
#pragma unroll
                    for (int e = 0; e < E; e++) acc[e] += pj * h2f(vr[e]);
                }
            }
        }
        mx = mn;
    }
    if (lane == 0) { sm[wid] = mx; sl[wid] = l; }
#pragma unroll
    for (int e = 0; e < E; e++) sacc[wid][lane * E + e] = acc[e];
    __syncthreads();
    float M = -1e30f;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    if (S == 1 && out) {
        // One split: the block's own merge is the result, written at once (no partial, no counter, no second pass;
        // the bits the merge below gives for one partial: its factor is exp(0) = 1).
        float L = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) L += sl[w] * __expf(sm[w] - M);
        for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < ATT_WARPS; w++) a += sacc[w][i] * __expf(sm[w] - M);
            const size_t oi = (size_t)t * Q_DIM + h * HEAD_DIM + i;
            out[oi] = a / L;
            if (qo) q8_block(a / L, qo + (size_t)t * Q_DIM, (h * HEAD_DIM + i) & ~31, Q_DIM, qd + oi / 32);
        }
        return;
    }
    // The block's partial: to global memory, or with CL to its shared memory, where after the barrier block 0 of
    // the cluster merges splits 0..S-1 with the arithmetic of the global merge below (the second barrier keeps
    // every block's shared memory alive until it has).
    __shared__ float cp[CL ? HEAD_DIM + 2 : 1];
    float* o = CL ? cp : part + ((size_t)(t * NUM_HEADS + h) * SG + z) * (HEAD_DIM + 2);
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) a += sacc[w][i] * __expf(sm[w] - M);
        o[2 + i] = a;
    }
    if (threadIdx.x == 0) {
        float L = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) L += sl[w] * __expf(sm[w] - M);
        o[0] = M;
        o[1] = L;
    }
    if constexpr (CL) {
        cluster_sync();
        if (z == 0) {
            float MM = -1e30f;
            for (int zz = 0; zz < S; zz++) MM = fmaxf(MM, cluster_ld(cp, zz));
            for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
                float LL = 0.f, acc2 = 0.f;
                for (int zz = 0; zz < S; zz++) {
                    const float c = __expf(cluster_ld(cp, zz) - MM);
                    LL += cluster_ld(cp + 1, zz) * c;
                    acc2 += cluster_ld(cp + 2 + i, zz) * c;
                }
                const size_t oi = (size_t)t * Q_DIM + h * HEAD_DIM + i;
                out[oi] = acc2 / LL;
                if (qo) q8_block(acc2 / LL, qo + (size_t)t * Q_DIM, (h * HEAD_DIM + i) & ~31, Q_DIM, qd + oi / 32);
            }
        }
        cluster_sync();
        return;
    }
    if (!out) return;
    // Fused merge: the last split to finish for (t, h) combines all S partials (counters return to 0 for the next
    // launch, so graph replays need no reset).
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[t * NUM_HEADS + h], 1) == S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float* pp = part + (size_t)(t * NUM_HEADS + h) * SG * (HEAD_DIM + 2);
    float MM = -1e30f;
    for (int zz = 0; zz < S; zz++) MM = fmaxf(MM, pp[zz * (HEAD_DIM + 2)]);
    // Blocks of 32 threads hold 32-blocks of the output (HEAD_DIM is a multiple of 32): with qo, also quantized to 8
    // bits for the output projection.
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
        float LL = 0.f, acc2 = 0.f;
        for (int zz = 0; zz < S; zz++) {
            const float c = __expf(pp[zz * (HEAD_DIM + 2)] - MM);
            LL += pp[zz * (HEAD_DIM + 2) + 1] * c;
            acc2 += pp[zz * (HEAD_DIM + 2) + 2 + i] * c;
        }
        const size_t oi = (size_t)t * Q_DIM + h * HEAD_DIM + i;
        out[oi] = acc2 / LL;
        if (qo) q8_block(acc2 / LL, qo + (size_t)t * Q_DIM, (h * HEAD_DIM + i) & ~31, Q_DIM, qd + oi / 32);
    }
    if (threadIdx.x == 0) counters[t * NUM_HEADS + h] = 0;
}
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attention(const float* __restrict__ q,
        const u16* __restrict__ kc, const u16* __restrict__ vc, const u32* __restrict__ pos,
        const u32* __restrict__ slot, const u32* __restrict__ table, float* __restrict__ part, float* out,
        int* counters, i8* __restrict__ qo, float2* __restrict__ qd) {
    attention_body<false>(q, kc, vc, pos, slot, table, part, out, counters, qo, qd);
}
#if ATT_CL > 1
extern "C" __global__ void __cluster_dims__(1, 1, ATT_CL) __launch_bounds__(32 * ATT_WARPS) attention_cl(
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
        const u32* __restrict__ pos, const u32* __restrict__ slot, const u32* __restrict__ table,
        float* __restrict__ part, float* out, int* counters, i8* __restrict__ qo, float2* __restrict__ qd) {
    attention_body<true>(q, kc, vc, pos, slot, table, part, out, counters, qo, qd);
}
#endif
#undef E

// out[t, h*D + i] = merge of the S partials of (t, h). Grid (m, NUM_HEADS), HEAD_DIM threads.
extern "C" __global__ void attn_combine(const float* __restrict__ part, float* __restrict__ out, int S) { PDL_ENTER
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const float* p = part + (size_t)(t * NUM_HEADS + h) * S * (HEAD_DIM + 2);
    float M = -1e30f;
    for (int z = 0; z < S; z++) M = fmaxf(M, p[z * (HEAD_DIM + 2)]);
    float L = 0.f, a = 0.f;
    for (int z = 0; z < S; z++) {
        const float c = __expf(p[z * (HEAD_DIM + 2)] - M);
        L += p[z * (HEAD_DIM + 2) + 1] * c;
        a += p[z * (HEAD_DIM + 2) + 2 + i] * c;
    }
    out[(size_t)t * Q_DIM + h * HEAD_DIM + i] = a / L;
}

// ---- Tensor-core prefill helpers: long chunks multiply f16 copies of the weights with cuBLAS (f32 accumulation).

// W[N, K] (quantized rows) -> out[N, K] f16, one thread per 32-weight unit.
template <int T, int K>
__device__ __forceinline__ void dequant_body(const u8* __restrict__ W, u16* __restrict__ out, int N) {
    const int NU = K / 32;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * NU) return;
    const size_t n = idx / NU;
    const int u = (int)(idx % NU);
    const size_t row_bytes = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    float w[32];
    const int off = unit<T>(W + n * row_bytes, u, w, K / 256);
    u32 a[16];
#pragma unroll
    for (int i = 0; i < 16; i++) a[i] = (u32)f2h(w[2 * i]) | ((u32)f2h(w[2 * i + 1]) << 16);
    uint4* p0 = (uint4*)(out + n * K + off);
    uint4* p1 = (uint4*)(out + n * K + off + Fmt<T>::DOFF);
    p0[0] = make_uint4(a[0], a[1], a[2], a[3]);
    p0[1] = make_uint4(a[4], a[5], a[6], a[7]);
    p1[0] = make_uint4(a[8], a[9], a[10], a[11]);
    p1[1] = make_uint4(a[12], a[13], a[14], a[15]);
}

// out[i] = f16(x[i]), saturating at the largest finite f16.
extern "C" __global__ void to_f16(const float* __restrict__ x, u16* __restrict__ out, int n) { PDL_ENTER
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < (size_t)n) {
        float4 v = *(const float4*)(x + i);
        u32 lo = (u32)f2h(fminf(fmaxf(v.x, -65504.f), 65504.f)) | ((u32)f2h(fminf(fmaxf(v.y, -65504.f), 65504.f)) << 16);
        u32 hi = (u32)f2h(fminf(fmaxf(v.z, -65504.f), 65504.f)) | ((u32)f2h(fminf(fmaxf(v.w, -65504.f), 65504.f)) << 16);
        *(uint2*)(out + i) = make_uint2(lo, hi);
    } else {
        for (size_t j = i; j < (size_t)n; j++) out[j] = f2h(fminf(fmaxf(x[j], -65504.f), 65504.f));
    }
}

// y[r, j] += b[j] for rows r < rows, j < N.
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, int N, int total) { PDL_ENTER
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % N];
}

// ---- Decode path on 8-bit activations (Q4_K and Q6_K weights), like ggml's mmvq: each activation row is quantized
// per 32 values (d = amax / 127, q = round(x / d)) into int8 plus a float2 {d, d * sum(q)} per block, and the weights
// are consumed 64 at a time ("pairs": two 32-blocks of activations) with dp4a, so no weight is converted to float.
// One weight row is split over P threads (P <= 32: lanes of one warp, reduced by shuffles; P = 64 or 128: several
// warps, reduced through shared memory), each taking pairs part, part + P, ... whose weights are all loaded before
// the first is used. The order of every sum depends only on the matrix's shape, never on the batch.

// Row i = blockIdx.x of x (row rows[i] when rows is set), RMS-normalised with weights g when g is set (the same
// arithmetic as rms_norm; every block sums the squares of the whole row), quantized to q[i * K ..],
// ds[i * K / 32 ..]. Grid (rows, ceil(K / 256)), 256 threads: one 32-block per warp.
extern "C" __global__ void quant_q8(const float* __restrict__ x, const float* __restrict__ g, const u32* __restrict__ rows,
                                    i8* __restrict__ q, float2* __restrict__ ds, int K) { PDL_ENTER
    __shared__ float sh[32];
    const int i = blockIdx.x;
    const float* xr = x + (size_t)(rows ? rows[i] : i) * K;
    float scale = 1.f;
    if (g && K == HIDDEN) {
        // K == HIDDEN with a norm (256 threads): every load of the row is issued before the first use (a loop with a
        // run-time bound waited for each load in turn: 10 us for the 32B's rows, ncu). Same sums in the same order.
        const int NL = (HIDDEN + 255) / 256;
        float xv[NL];
#pragma unroll
        for (int j = 0; j < NL; j++) xv[j] = threadIdx.x + 256 * j < HIDDEN ? xr[threadIdx.x + 256 * j] : 0.f;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < NL; j++) s += xv[j] * xv[j];
        s = block_sum(s, sh);
        scale = rsqrtf(s / (float)K + RMS_EPS);
    } else if (g) {
        float s = 0.f;
        for (int k = threadIdx.x; k < K; k += blockDim.x) s += xr[k] * xr[k];
        s = block_sum(s, sh);
        scale = rsqrtf(s / (float)K + RMS_EPS);
    }
    const int k = blockIdx.y * 256 + threadIdx.x;
    if (k - (threadIdx.x & 31) < K) {
        const float v = g ? xr[k] * scale * g[k] : xr[k];
        q8_block(v, q + (size_t)i * K, k & ~31, K, ds + ((size_t)i * K + k) / 32);
    }
}

// The same as quant_q8 with a norm, for the rows [0, m) (m <= MR) of X (width HIDDEN, RMS-normalised with weights g)
// into shared memory (sq: MR rows of HIDDEN int8 in the xpos layout, sd: a float2 per 32 values), by a block of NT
// threads (NT divides 256): the consumer's prologue, so no separate launch. The sum of squares is formed exactly as
// quant_q8's 256 threads form it (thread t takes the virtual threads t, t + NT, ...: each one's values in the same
// order, the same warp trees, the eight warp sums added in order), and the 8-bit values depend only on each 32-block's
// values, so the results are quant_q8's to the bit. Ends with __syncthreads (the whole block must call it).
template <int NT, int MR>
__device__ __forceinline__ void norm_q8_smem(const float* __restrict__ X, const float* __restrict__ g, int m,
                                             i8* __restrict__ sq, float2* __restrict__ sd) {
    static_assert(256 % NT == 0, "the block size must divide 256");
    __shared__ float sh[MR][8];
    const int tid = threadIdx.x, lane = tid & 31;
    const int NL = (HIDDEN + 255) / 256, C = 256 / NT;
    for (int r = 0; r < m; r++) {
        const float* xr = X + (size_t)r * HIDDEN;
        float xv[C][NL];
#pragma unroll
        for (int c = 0; c < C; c++) {
#pragma unroll
            for (int j = 0; j < NL; j++) {
                const int k = tid + NT * c + 256 * j;
                xv[c][j] = k < HIDDEN ? xr[k] : 0.f;
            }
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            float s = 0.f;
#pragma unroll
            for (int j = 0; j < NL; j++) s += xv[c][j] * xv[c][j];
            s = warp_sum(s);
            if (lane == 0) sh[r][(tid + NT * c) >> 5] = s;
        }
    }
    __syncthreads();
    // Eight consecutive values per thread, four threads per 32-block.
    const int PER_ROW = HIDDEN / 8;
    for (int base = 0; base < m * PER_ROW; base += NT) {
        const int idx = base + tid;
        const bool on = idx < m * PER_ROW;
        const int r = on ? idx / PER_ROW : 0, e = on ? (idx % PER_ROW) * 8 : 0;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) s += sh[r][w];
        const float scale = rsqrtf(s / (float)HIDDEN + RMS_EPS);
        const float* xr = X + (size_t)r * HIDDEN + e;
        const float4 x0 = *(const float4*)xr, x1 = *(const float4*)(xr + 4);
        const float4 g0 = *(const float4*)(g + e), g1 = *(const float4*)(g + e + 4);
        const float v[8] = {x0.x * scale * g0.x, x0.y * scale * g0.y, x0.z * scale * g0.z, x0.w * scale * g0.w,
                            x1.x * scale * g1.x, x1.y * scale * g1.y, x1.z * scale * g1.z, x1.w * scale * g1.w};
        float amax = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) amax = fmaxf(amax, fabsf(v[w]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float id = amax > 0.f ? 127.f / amax : 0.f;
        int qs = 0;
        u32 lo = 0, hi = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const int qi = (int)rintf(v[w] * id);
            qs += qi;
            if (w < 4) lo |= ((u32)qi & 0xFFu) << (8 * w);
            else hi |= ((u32)qi & 0xFFu) << (8 * (w - 4));
        }
        qs += __shfl_xor_sync(0xffffffffu, qs, 1);
        qs += __shfl_xor_sync(0xffffffffu, qs, 2);
        if (on) {
            *(uint2*)(sq + r * HIDDEN + xpos(e, HIDDEN)) = make_uint2(lo, hi);
            if ((idx & 3) == 0) {
                const float d = amax / 127.f;
                sd[r * (HIDDEN / 32) + e / 32] = make_float2(d, d * (float)qs);
            }
        }
    }
    __syncthreads();
}

struct PQ4K { uint4 h, a, b; };
struct PQ6K { uint4 l0, l1, h0, h1, s; u32 d; };
struct PQ8 { u32 d0, d1; u32 q0[8], q1[8]; };
struct PQ5 { u32 d0, d1, h0, h1; uint2 q0[2], q1[2]; };
template <int T> struct Pair;
template <> struct Pair<T_Q4_K> { typedef PQ4K W; };
template <> struct Pair<T_Q6_K> { typedef PQ6K W; };
template <> struct Pair<T_Q8_0> { typedef PQ8 W; };
template <> struct Pair<T_Q5_0> { typedef PQ5 W; };

// A weight load (loads cached in L2 only were slower: benchmarks/log, stretch 8).
template <class T> __device__ __forceinline__ T wld(const u8* p) { return *(const T*)p; }
// Pair p of a (repacked) Q8_0 / Q5_0 row: blocks 2p and 2p + 1.
__device__ __forceinline__ void pload(const u8* row, int p, PQ8& w, int nsb) {
    const u8* b = row + p * 72;
    w.d0 = wld<u16>(b);
    w.d1 = wld<u16>(b + 36);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        w.q0[i] = wld<u32>(b + 4 + 4 * i);
        w.q1[i] = wld<u32>(b + 40 + 4 * i);
    }
}
__device__ __forceinline__ void pload(const u8* row, int p, PQ5& w, int nsb) {
    const u8* b = row + p * 48;
    w.d0 = wld<u16>(b);
    w.d1 = wld<u16>(b + 24);
    w.h0 = wld<u32>(b + 4);
    w.h1 = wld<u32>(b + 28);
    w.q0[0] = wld<uint2>(b + 8);
    w.q0[1] = wld<uint2>(b + 16);
    w.q1[0] = wld<uint2>(b + 32);
    w.q1[1] = wld<uint2>(b + 40);
}
// Bits 0..3 of x to bit 0 of bytes 0..3.
__device__ __forceinline__ u32 spread4(u32 x) { return ((x & 0xFu) * 0x00204081u) & 0x01010101u; }
// Bytes 0..31 minus 16 each.
__device__ __forceinline__ int sub16x4(u32 v) { return (int)(((v | 0x80808080u) - 0x10101010u) ^ 0x80808080u); }

// Pair p of a Q4_K row: superblock p / 4, sub-blocks 2j and 2j + 1 (j = p % 4): header (d, dmin, scales) and the
// 32 bytes of nibbles.
__device__ __forceinline__ void pload(const u8* row, int p, PQ4K& w, int nsb) {
#if REPACK
    w.h = wld<uint4>(row + nsb * 128 + 16 * (p >> 2));
    w.a = wld<uint4>(row + 16 * p);
    w.b = wld<uint4>(row + nsb * 64 + 16 * p);
#else
    const u8* b = row + (p >> 2) * 144;
    const int j = p & 3;
    w.h = wld<uint4>(b);
    w.a = wld<uint4>(b + 16 + 32 * j);
    w.b = wld<uint4>(b + 32 + 32 * j);
#endif
}

// Pair p of a (repacked) Q6_K row: superblock p / 4, half hf = (p / 2) % 2, quarter pp = p % 2: positions
// 128 hf + 32 pp + [0, 32) (low nibbles) and + 64 (high nibbles).
__device__ __forceinline__ void pload(const u8* row, int p, PQ6K& w, int nsb) {
#if REPACK
    w.l0 = wld<uint4>(row + 16 * p);
    w.l1 = wld<uint4>(row + nsb * 64 + 16 * p);
    w.h0 = wld<uint4>(row + nsb * 128 + 16 * (p >> 1));
    w.h1 = wld<uint4>(row + nsb * 160 + 16 * (p >> 1));
    w.s = wld<uint4>(row + nsb * 192 + 16 * (p >> 2));
    w.d = wld<u16>(row + nsb * 208 + 2 * (p >> 2));
#else
    const u8* b = row + (p >> 2) * 224;
    const int hf = (p >> 1) & 1, pp = p & 1;
    w.l0 = wld<uint4>(b + 64 * hf + 32 * pp);
    w.l1 = wld<uint4>(b + 64 * hf + 32 * pp + 16);
    w.h0 = wld<uint4>(b + 128 + 32 * hf);
    w.h1 = wld<uint4>(b + 128 + 32 * hf + 16);
    w.s = wld<uint4>(b + 192);
    w.d = wld<u16>(b + 208);
#endif
}

// What a Q4_K pair multiplies in one 8-bit activation row: its four 16-byte chunks and the float4 of its two
// 32-blocks' {d, s}.
struct XPair {
    int4 x0, x1, x2, x3;
    float4 dd;
};
// Pair p's activations in row r (at xq + r * K, xd + r * K / 32).
template <int K>
__device__ __forceinline__ XPair xpair(const i8* __restrict__ xq, const float2* __restrict__ xd, int r, int p) {
    const i8* xr = xq + (size_t)r * K;
    return {xchunk<K>(xr, 4 * p), xchunk<K>(xr, 4 * p + 1), xchunk<K>(xr, 4 * p + 2), xchunk<K>(xr, 4 * p + 3),
            *(const float4*)(xd + (size_t)r * (K / 32) + 2 * p)};
}

// A Q4_K pair decoded: the nibbles as bytes, the two sub-blocks' scales and mins, d and dmin.
struct DQ4K {
    int lo[8], hi[8];
    int s0, m0, s1, m1;
    float d, dmin;
    __device__ __forceinline__ DQ4K(const PQ4K& w, int p) {
        const int j = p & 3;
        const u32 a[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lo[i] = (int)(a[i] & 0x0F0F0F0Fu);
            hi[i] = (int)((a[i] >> 4) & 0x0F0F0F0Fu);
        }
        const int k0 = (2 * j) & 3, k1 = (2 * j + 1) & 3;
        if (j < 2) {
            s0 = byte_of(w.h.y, k0) & 63; m0 = byte_of(w.h.z, k0) & 63;
            s1 = byte_of(w.h.y, k1) & 63; m1 = byte_of(w.h.z, k1) & 63;
        } else {
            s0 = (byte_of(w.h.w, k0) & 0xF) | ((byte_of(w.h.y, k0) >> 6) << 4);
            m0 = (byte_of(w.h.w, k0) >> 4) | ((byte_of(w.h.z, k0) >> 6) << 4);
            s1 = (byte_of(w.h.w, k1) & 0xF) | ((byte_of(w.h.y, k1) >> 6) << 4);
            m1 = (byte_of(w.h.w, k1) >> 4) | ((byte_of(w.h.z, k1) >> 6) << 4);
        }
        d = h2f((u16)(w.h.x & 0xFFFF));
        dmin = h2f((u16)(w.h.x >> 16));
    }
    // This pair's share of one activation row.
    __device__ __forceinline__ float dot(const XPair& x) const {
        int sa = 0, sc = 0;
        sa = dp4a(lo[0], x.x0.x, sa); sa = dp4a(lo[1], x.x0.y, sa); sa = dp4a(lo[2], x.x0.z, sa); sa = dp4a(lo[3], x.x0.w, sa);
        sa = dp4a(lo[4], x.x1.x, sa); sa = dp4a(lo[5], x.x1.y, sa); sa = dp4a(lo[6], x.x1.z, sa); sa = dp4a(lo[7], x.x1.w, sa);
        sc = dp4a(hi[0], x.x2.x, sc); sc = dp4a(hi[1], x.x2.y, sc); sc = dp4a(hi[2], x.x2.z, sc); sc = dp4a(hi[3], x.x2.w, sc);
        sc = dp4a(hi[4], x.x3.x, sc); sc = dp4a(hi[5], x.x3.y, sc); sc = dp4a(hi[6], x.x3.z, sc); sc = dp4a(hi[7], x.x3.w, sc);
        return d * (x.dd.x * (float)(s0 * sa) + x.dd.z * (float)(s1 * sc)) -
               dmin * ((float)m0 * x.dd.y + (float)m1 * x.dd.w);
    }
};

// Sums of pair p against MR activation rows (row r at xq + r * K, xd + r * K / 32), added to acc[r] for r < m.
template <int K, int MR>
__device__ __forceinline__ void pdot(const PQ4K& w, int p, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                     int m, float* acc) {
    const DQ4K q(w, p);
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) acc[r] += q.dot(xpair<K>(xq, xd, r, p));
    }
}
// Pair p of two rows (gate wg into a, up wu into c) against the same activations, loaded once. The same sums in
// the same order as two pdot calls.
template <int K, int MR>
__device__ __forceinline__ void pdot2(const PQ4K& wg, const PQ4K& wu, int p, const i8* __restrict__ xq,
                                      const float2* __restrict__ xd, int m, float* a, float* c) {
    const DQ4K qg(wg, p), qu(wu, p);
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) {
            const XPair x = xpair<K>(xq, xd, r, p);
            a[r] += qg.dot(x);
            c[r] += qu.dot(x);
        }
    }
}
// Other types: two pdot calls.
template <int K, int MR, class W>
__device__ __forceinline__ void pdot2(const W& wg, const W& wu, int p, const i8* __restrict__ xq,
                                      const float2* __restrict__ xd, int m, float* a, float* c) {
    pdot<K, MR>(wg, p, xq, xd, m, a);
    pdot<K, MR>(wu, p, xq, xd, m, c);
}
template <int K, int MR>
__device__ __forceinline__ void pdot(const PQ6K& w, int p, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                     int m, float* acc) {
    const int sb = p >> 2, hf = (p >> 1) & 1, pp = p & 1;
    const int shl = 2 * pp, shh = 4 + 2 * pp;
    const u32 l[8] = {w.l0.x, w.l0.y, w.l0.z, w.l0.w, w.l1.x, w.l1.y, w.l1.z, w.l1.w};
    const u32 h[8] = {w.h0.x, w.h0.y, w.h0.z, w.h0.w, w.h1.x, w.h1.y, w.h1.z, w.h1.w};
    int lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        lo[i] = sub32x4((l[i] & 0x0F0F0F0Fu) | (((h[i] >> shl) & 0x03030303u) << 4));
        hi[i] = sub32x4(((l[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> shh) & 0x03030303u) << 4));
    }
    const u32 lw = hf ? w.s.z : w.s.x, hw = hf ? w.s.w : w.s.y;
    const int scl0 = (int)(i8)byte_of(lw, 2 * pp), scl1 = (int)(i8)byte_of(lw, 2 * pp + 1);
    const int sch0 = (int)(i8)byte_of(hw, 2 * pp), sch1 = (int)(i8)byte_of(hw, 2 * pp + 1);
    const float d = h2f((u16)w.d);
    const int base = sb * 256 + 128 * hf + 32 * pp;
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) {
            const i8* xr = xq + (size_t)r * K;
            const int cb = base >> 4;
            const int4 a0 = xchunk<K>(xr, cb), a1 = xchunk<K>(xr, cb + 1), c0 = xchunk<K>(xr, cb + 4),
                       c1 = xchunk<K>(xr, cb + 5);
            const float2* dr = xd + (size_t)r * (K / 32) + sb * 8 + 4 * hf + pp;
            const float dl = dr[0].x, dh = dr[2].x;
            int il0 = 0, il1 = 0, ih0 = 0, ih1 = 0;
            il0 = dp4a(lo[0], a0.x, il0); il0 = dp4a(lo[1], a0.y, il0); il0 = dp4a(lo[2], a0.z, il0); il0 = dp4a(lo[3], a0.w, il0);
            il1 = dp4a(lo[4], a1.x, il1); il1 = dp4a(lo[5], a1.y, il1); il1 = dp4a(lo[6], a1.z, il1); il1 = dp4a(lo[7], a1.w, il1);
            ih0 = dp4a(hi[0], c0.x, ih0); ih0 = dp4a(hi[1], c0.y, ih0); ih0 = dp4a(hi[2], c0.z, ih0); ih0 = dp4a(hi[3], c0.w, ih0);
            ih1 = dp4a(hi[4], c1.x, ih1); ih1 = dp4a(hi[5], c1.y, ih1); ih1 = dp4a(hi[6], c1.z, ih1); ih1 = dp4a(hi[7], c1.w, ih1);
            acc[r] += d * (dl * (float)(scl0 * il0 + scl1 * il1) + dh * (float)(sch0 * ih0 + sch1 * ih1));
        }
    }
}

template <int K, int MR>
__device__ __forceinline__ void pdot(const PQ8& w, int p, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                     int m, float* acc) {
    const float d0 = h2f((u16)w.d0), d1 = h2f((u16)w.d1);
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) {
            const i8* xr = xq + (size_t)r * K;
            const int4 x0 = xchunk<K>(xr, 4 * p), x1 = xchunk<K>(xr, 4 * p + 1), x2 = xchunk<K>(xr, 4 * p + 2),
                       x3 = xchunk<K>(xr, 4 * p + 3);
            const float4 dd = *(const float4*)(xd + (size_t)r * (K / 32) + 2 * p);
            int s0 = 0, s1 = 0;
            s0 = dp4a((int)w.q0[0], x0.x, s0); s0 = dp4a((int)w.q0[1], x0.y, s0); s0 = dp4a((int)w.q0[2], x0.z, s0);
            s0 = dp4a((int)w.q0[3], x0.w, s0); s0 = dp4a((int)w.q0[4], x1.x, s0); s0 = dp4a((int)w.q0[5], x1.y, s0);
            s0 = dp4a((int)w.q0[6], x1.z, s0); s0 = dp4a((int)w.q0[7], x1.w, s0);
            s1 = dp4a((int)w.q1[0], x2.x, s1); s1 = dp4a((int)w.q1[1], x2.y, s1); s1 = dp4a((int)w.q1[2], x2.z, s1);
            s1 = dp4a((int)w.q1[3], x2.w, s1); s1 = dp4a((int)w.q1[4], x3.x, s1); s1 = dp4a((int)w.q1[5], x3.y, s1);
            s1 = dp4a((int)w.q1[6], x3.z, s1); s1 = dp4a((int)w.q1[7], x3.w, s1);
            acc[r] += d0 * dd.x * (float)s0 + d1 * dd.z * (float)s1;
        }
    }
}
// One Q5_0 block (qh bits, 16 bytes of nibbles) as 8 words of signed bytes: weights 0..15, then 16..31.
__device__ __forceinline__ void q5_bytes(u32 qh, uint2 q0, uint2 q1, int* v) {
    const u32 q[4] = {q0.x, q0.y, q1.x, q1.y};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[k] = sub16x4((q[k] & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4));
        v[4 + k] = sub16x4(((q[k] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * k)) << 4));
    }
}
template <int K, int MR>
__device__ __forceinline__ void pdot(const PQ5& w, int p, const i8* __restrict__ xq, const float2* __restrict__ xd,
                                     int m, float* acc) {
    int a[8], b[8];
    q5_bytes(w.h0, w.q0[0], w.q0[1], a);
    q5_bytes(w.h1, w.q1[0], w.q1[1], b);
    const float d0 = h2f((u16)w.d0), d1 = h2f((u16)w.d1);
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < m) {
            const i8* xr = xq + (size_t)r * K;
            const int4 x0 = xchunk<K>(xr, 4 * p), x1 = xchunk<K>(xr, 4 * p + 1), x2 = xchunk<K>(xr, 4 * p + 2),
                       x3 = xchunk<K>(xr, 4 * p + 3);
            const float4 dd = *(const float4*)(xd + (size_t)r * (K / 32) + 2 * p);
            int s0 = 0, s1 = 0;
            s0 = dp4a(a[0], x0.x, s0); s0 = dp4a(a[1], x0.y, s0); s0 = dp4a(a[2], x0.z, s0); s0 = dp4a(a[3], x0.w, s0);
            s0 = dp4a(a[4], x1.x, s0); s0 = dp4a(a[5], x1.y, s0); s0 = dp4a(a[6], x1.z, s0); s0 = dp4a(a[7], x1.w, s0);
            s1 = dp4a(b[0], x2.x, s1); s1 = dp4a(b[1], x2.y, s1); s1 = dp4a(b[2], x2.z, s1); s1 = dp4a(b[3], x2.w, s1);
            s1 = dp4a(b[4], x3.x, s1); s1 = dp4a(b[5], x3.y, s1); s1 = dp4a(b[6], x3.z, s1); s1 = dp4a(b[7], x3.w, s1);
            acc[r] += d0 * dd.x * (float)s0 + d1 * dd.z * (float)s1;
        }
    }
}

// The pairs of one row that one thread takes (part, part + P, ...), loaded up front.
template <int T, int K, int P> struct RowQ {
    static const int NP = K / 64, IT = (NP + P - 1) / P;
    typename Pair<T>::W w[IT];
    __device__ __forceinline__ void load(const u8* row, int part) {
#pragma unroll
        for (int i = 0; i < IT; i++)
            if (part + P * i < NP) pload(row, part + P * i, w[i], K / 256);
    }
    // acc[r] = this thread's share of row r, reduced over the min(P, 32) lanes of its group.
    template <int MR>
    __device__ __forceinline__ void dot(int part, const i8* xq, const float2* xd, int m, float* acc) const {
#pragma unroll
        for (int r = 0; r < MR; r++) acc[r] = 0.f;
#pragma unroll
        for (int i = 0; i < IT; i++)
            if (part + P * i < NP) pdot<K, MR>(w[i], part + P * i, xq, xd, m, acc);
        reduce<MR>(acc);
    }
    // Gate (this) and up (u) together: pair i of both in turn, so that the activations they share are loaded once
    // (GU_DOT2; two dot calls load them twice: the compiler does not merge the loads across the shuffles of the first
    // reduction). Each accumulator takes the same sums in the same order as dot.
    template <int MR>
    __device__ __forceinline__ void dot2(const RowQ& u, int part, const i8* xq, const float2* xd, int m, float* a,
                                         float* c) const {
#pragma unroll
        for (int r = 0; r < MR; r++) a[r] = c[r] = 0.f;
#pragma unroll
        for (int i = 0; i < IT; i++)
            if (part + P * i < NP) pdot2<K, MR>(w[i], u.w[i], part + P * i, xq, xd, m, a, c);
        reduce<MR>(a);
        reduce<MR>(c);
    }
    template <int MR> __device__ __forceinline__ static void reduce(float* acc) {
#pragma unroll
        for (int r = 0; r < MR; r++) {
#pragma unroll
            for (int o = (P < 32 ? P : 32) / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        }
    }
};

// Y[r, n] (+)= W[n, :] . X[r, :] (+ bias[n]) on 8-bit activations. 128 threads, 128 / P rows per block.
template <int T, int K, int MR, int MODE, int P>
__device__ __forceinline__ void mmvq_body(const u8* __restrict__ W, const i8* __restrict__ Xq,
                                          const float2* __restrict__ Xd, float* __restrict__ Y,
                                          const float* __restrict__ bias, int m, int N) {
    const int tid = threadIdx.x;
    const int n = blockIdx.x * (128 / P) + tid / P, part = tid % P;
    Xq += (size_t)blockIdx.y * MR * K;
    Xd += (size_t)blockIdx.y * MR * (K / 32);
    Y += (size_t)blockIdx.y * MR * N;
    m = min(m - (int)blockIdx.y * MR, MR);
    RowQ<T, K, P> rq;
    rq.load(W + (size_t)min(n, N - 1) * (K / Fmt<T>::BLOCK) * Fmt<T>::BYTES, part);
    pdl_wait();
    float acc[MR];
    rq.template dot<MR>(part, Xq, Xd, m, acc);
    if (P > 32) {
        __shared__ float red[4][MR];
        const int wid = tid >> 5;
        if ((tid & 31) == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++) red[wid][r] = acc[r];
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++) {
                float v = 0.f;
                for (int w2 = 0; w2 < P / 32; w2++) v += red[wid + w2][r];
                acc[r] = v;
            }
        }
    }
    if (part == 0 && n < N) {
        const float b = bias ? bias[n] : 0.f;
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < m) {
                if (MODE == 1) Y[(size_t)r * N + n] += acc[r] + b;
                else Y[(size_t)r * N + n] = acc[r] + b;
            }
        }
    }
}

// Gate and up on 8-bit activations, writing silu(gate) * up (P <= 32). QOUT: blocks of 32 * P threads take 32
// consecutive rows and also write the result quantized to 8 bits (Qo, Do: the down projection's input); else 128
// threads.
// NORM (K == HIDDEN): the input is X (f32 rows) RMS-normalised with weights gn and quantized in the prologue
// (norm_q8_smem) into shared memory, instead of Xq / Xd written by quant_q8 in a launch of its own.
template <int T, int K, int MR, int P, bool QOUT, bool NORM = false>
__device__ __forceinline__ void guq_body(const u8* __restrict__ Wg, const u8* __restrict__ Wu,
                                         const i8* __restrict__ Xq, const float2* __restrict__ Xd,
                                         float* __restrict__ Y, int m, int N, i8* __restrict__ Qo,
                                         float2* __restrict__ Do, const float* __restrict__ X = nullptr,
                                         const float* __restrict__ gn = nullptr) {
    const int tid = threadIdx.x;
    const int RPB = QOUT ? 32 : 128 / P;
    const int n = blockIdx.x * RPB + tid / P, part = tid % P;
    Xq += (size_t)blockIdx.y * MR * K;
    Xd += (size_t)blockIdx.y * MR * (K / 32);
    Y += (size_t)blockIdx.y * MR * N;
    m = min(m - (int)blockIdx.y * MR, MR);
    const size_t rb = (size_t)(K / Fmt<T>::BLOCK) * Fmt<T>::BYTES;
    RowQ<T, K, P> g, u;
    g.load(Wg + (size_t)min(n, N - 1) * rb, part);
    u.load(Wu + (size_t)min(n, N - 1) * rb, part);
    pdl_wait();
    if constexpr (NORM) {
        static_assert(K == HIDDEN, "the fused norm is the FFN's");
        __shared__ __align__(16) i8 sxq[MR * K];
        __shared__ __align__(16) float2 sxd[MR * K / 32];
        norm_q8_smem<QOUT ? 32 * P : 128, MR>(X + (size_t)blockIdx.y * MR * K, gn, m, sxq, sxd);
        Xq = sxq;
        Xd = sxd;
    }
    float a[MR], c[MR];
    if (GU_DOT2) {
        g.template dot2<MR>(u, part, Xq, Xd, m, a, c);
    } else {
        g.template dot<MR>(part, Xq, Xd, m, a);
        u.template dot<MR>(part, Xq, Xd, m, c);
    }
    if (part == 0 && n < N) {
#pragma unroll
        for (int r = 0; r < MR; r++)
            if (r < m) {
                a[r] = a[r] / (1.f + __expf(-a[r])) * c[r];
                Y[(size_t)r * N + n] = a[r];
            }
    }
    if (QOUT) {
        __shared__ float ys[MR][32];
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++) ys[r][tid / P] = a[r];
        }
        __syncthreads();
        const int n0 = blockIdx.x * 32;
        Qo += (size_t)blockIdx.y * MR * N;
        Do += (size_t)blockIdx.y * MR * (N / 32);
        for (int r = tid >> 5; r < m; r += P)
            if (n0 < N) q8_block(ys[r][tid & 31], Qo + (size_t)r * N, n0, N, Do + ((size_t)r * N + n0) / 32);
    }
}

// Rows [0, RPB) of the block's share of one projection (the block's rows all lie in one matrix). NORM: the input is
// X RMS-normalised with g and quantized in the prologue. ROPE (q and k): the block's row slots are pairs of rows
// that RoPE turns together (slots 2j, 2j + 1 = dimensions ia, ib of pair i of a head), rotated in the epilogue and
// written to `Y` (q, f32) or, with KV set, to the paged cache (k); V rows (KV set, ROPE off) go to the cache too.
// The same sums and the same rotation (rope_rot) as qkvq + rope_kv, so the same bits.
template <int T, int MR, int P, bool NORM, bool ROPE>
__device__ __forceinline__ void qkvq_rows(const u8* W, int n, int part, const i8* Xq, const float2* Xd, int m,
                                          float* Y, int N, const float* bias, const float* X, const float* g,
                                          const float* inv_freq, const u32* pos, const u32* slot, const u32* table,
                                          u16* kv, i8* sxq, float2* sxd, float (*ys)[32]) {
    const int lr = threadIdx.x / P;
    int row = n, pi = 0;
    if constexpr (ROPE) {
        // Slot n: pair pi of its head, dimension ia (even slot) or ib (odd slot).
        pi = (n >> 1) % (HEAD_DIM / 2);
        int ia, ib;
        rope_pair(pi, ia, ib);
        row = (n >> 1) / (HEAD_DIM / 2) * HEAD_DIM + ((n & 1) ? ib : ia);
    }
    RowQ<T, HIDDEN, P> rq;
    rq.load(W + (size_t)row * (HIDDEN / Fmt<T>::BLOCK) * Fmt<T>::BYTES, part);
    pdl_wait();
    if constexpr (NORM) {
        norm_q8_smem<128, MR>(X, g, m, sxq, sxd);
        Xq = sxq;
        Xd = sxd;
    }
    float acc[MR];
    rq.template dot<MR>(part, Xq, Xd, m, acc);
    const float b = bias ? bias[row] : 0.f;
    if (!ROPE && !kv) {
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++)
                if (r < m) Y[(size_t)r * N + row] = acc[r] + b;
        }
        return;
    }
    // Epilogue into the cache (k, v) or q rotated: row r of the block is row blockIdx.y * MR + r of the launch.
    const int t0 = blockIdx.y * MR;
    if constexpr (ROPE) {
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++) ys[r][lr] = acc[r] + b;
        }
        __syncthreads();
        if (part == 0 && (n & 1) == 0) {
            int ia, ib;
            rope_pair(pi, ia, ib);
            const int hb = (n >> 1) / (HEAD_DIM / 2) * HEAD_DIM;
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r >= m) continue;
                const int t = t0 + r;
                const u32 p = pos[t];
                float a2, b2;
                rope_rot(ys[r][lr], ys[r][lr + 1], p, inv_freq, pi, a2, b2);
                if (Y) {
                    Y[(size_t)r * N + hb + ia] = a2;
                    Y[(size_t)r * N + hb + ib] = b2;
                } else {
                    const size_t crow = (size_t)table[(size_t)slot[t] * MAX_PAGES + p / PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE;
                    kv[crow * KV_DIM + hb + ia] = f2h(a2);
                    kv[crow * KV_DIM + hb + ib] = f2h(b2);
                }
            }
        }
    } else {
        if (part == 0) {
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r >= m) continue;
                const int t = t0 + r;
                const u32 p = pos[t];
                const size_t crow = (size_t)table[(size_t)slot[t] * MAX_PAGES + p / PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE;
                kv[crow * KV_DIM + row] = f2h(acc[r] + b);
            }
        }
    }
}

// Q, K and V projections in one launch on 8-bit activations (already RMS-normalised), with their biases. Rows of
// wq, then wk, then wv; 128 / P rows per block (P <= 32; Q_DIM and KV_DIM are multiples of 32, so no block straddles
// two matrices). FUSE_NORM: the attention RMSNorm and quantization in the prologue (X, g). QKV_ROPE: RoPE and the
// KV-cache write in the epilogue (q rotated in place in `q`; k and v only into the cache, `k` and `v` not written).
template <int TQ, int TK, int TV, int MR, int P>
__device__ __forceinline__ void qkvq_body(const u8* Wq, const u8* Wk, const u8* Wv, const i8* Xq, const float2* Xd,
                                          const float* bq, const float* bk, const float* bv, float* q, float* k,
                                          float* v, int m, const float* X, const float* g, const float* inv_freq,
                                          const u32* pos, const u32* slot, const u32* table, u16* kc, u16* vc) {
    const int tid = threadIdx.x;
    int n = blockIdx.x * (128 / P) + tid / P;
    const int part = tid % P;
    Xq += (size_t)blockIdx.y * MR * HIDDEN;
    Xd += (size_t)blockIdx.y * MR * (HIDDEN / 32);
    X += (size_t)blockIdx.y * MR * HIDDEN;
    const size_t r0 = (size_t)blockIdx.y * MR;
    m = min(m - (int)blockIdx.y * MR, MR);
    constexpr bool NORM = FUSE_NORM != 0, ROPE = QKV_ROPE != 0;
    // Shared by the three branches (one copy per block).
    __shared__ __align__(16) i8 sxq[NORM ? MR * HIDDEN : 16];
    __shared__ __align__(16) float2 sxd[NORM ? MR * HIDDEN / 32 : 2];
    __shared__ float ys[ROPE ? MR : 1][32];
    // Every block lies in one matrix (see above): the branch is the same for all its threads.
    const int nb = blockIdx.x * (128 / P);
    if (nb < Q_DIM) {
        qkvq_rows<TQ, MR, P, NORM, ROPE>(Wq, n, part, Xq, Xd, m, q + r0 * Q_DIM, Q_DIM, bq, X, g, inv_freq, pos, slot,
                                         table, nullptr, sxq, sxd, ys);
    } else if (nb < Q_DIM + KV_DIM) {
        qkvq_rows<TK, MR, P, NORM, ROPE>(Wk, n - Q_DIM, part, Xq, Xd, m, ROPE ? nullptr : k + r0 * KV_DIM, KV_DIM, bk, X,
                                         g, inv_freq, pos, slot, table, ROPE ? kc : nullptr, sxq, sxd, ys);
    } else if (nb < Q_DIM + 2 * KV_DIM) {
        qkvq_rows<TV, MR, P, NORM, false>(Wv, n - Q_DIM - KV_DIM, part, Xq, Xd, m, v + r0 * KV_DIM, KV_DIM, bv, X, g,
                                          inv_freq, pos, slot, table, ROPE ? vc : nullptr, sxq, sxd, ys);
    }
}

// Rows are reduced by gridDim.y blocks each, every block over one contiguous segment, with its loads issued
// ROW_UNROLL at a time (one block per row waited for ~150 dependent loads per thread); the last block of a row to
// finish (counters[row], back to 0 after it) merges the blocks' partials.
#define ROW_UNROLL 8
__device__ __forceinline__ void row_segment(int n, int& s0, int& s1) {
    const int seg = (n + gridDim.y - 1) / gridDim.y;
    s0 = min(n, (int)blockIdx.y * seg);
    s1 = min(n, s0 + seg);
}
// v[u] = x[i0 + u * blockDim.x] for u < ROW_UNROLL, fill from s1 on: the loads issued together.
__device__ __forceinline__ void row_load(const float* __restrict__ x, int i0, int s1, float fill, float* v) {
#pragma unroll
    for (int u = 0; u < ROW_UNROLL; u++) {
        const int i = i0 + u * blockDim.x;
        v[u] = i < s1 ? x[i] : fill;
    }
}
// True in the last block of row blockIdx.x to finish (after its partials are written by every thread).
__device__ __forceinline__ bool last_of_row(u32* counters) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
        if (last) counters[blockIdx.x] = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}
// The better of (v, j) and (bv, bi): larger, then lower index; NaN never wins.
__device__ __forceinline__ void arg_better(float v, int j, float& bv, int& bi) {
    if (v > bv || (v == bv && j < bi)) { bv = v; bi = j; }
}
__device__ __forceinline__ void block_argmax(float& bv, int& bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        arg_better(__shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o), bv, bi);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sv[wid] = bv; si[wid] = bi; }
    __syncthreads();
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : __int_as_float(0xff800000);
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        arg_better(__shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o), bv, bi);
}
// ids[i] = index of the largest of logits[i * n .. (i + 1) * n) (the first on ties; NaN never wins; 0 when none is
// larger than -inf), as the host's argmax over the copied logits gives. With probs set, also probs[i] = the pick's
// softmax probability, 1 / sum(exp(logit - max)) (models::top_prob; another summation order, so not its bits): each
// block sums exp(logit - its own max), the merge rescales. part: 4 floats per (row, block). Grid (rows, blocks).
// Decode ahead (one row): with feed set (the pass's metadata: its token, then its position), the pick becomes the
// token and the position advances by one, ready for a next pass that the host enqueued before knowing the pick and
// without copying its metadata; with ring set (page-locked host memory), the pick and the pass's position p also go
// to ring[p % 2] as p << 32 | pick, where the host reads it once the pass is done, with no copy in the stream.
extern "C" __global__ void __launch_bounds__(256) argmax_rows(const float* __restrict__ logits, int n,
                                                              u32* __restrict__ ids, float* __restrict__ probs,
                                                              float* __restrict__ part, u32* __restrict__ counters,
                                                              u32* __restrict__ feed,
                                                              unsigned long long* __restrict__ ring) {
    PDL_ENTER
    __shared__ float sh[32];
    const float* x = logits + (size_t)blockIdx.x * n;
    int s0, s1;
    row_segment(n, s0, s1);
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    for (int i0 = s0 + threadIdx.x; i0 < s1; i0 += ROW_UNROLL * blockDim.x) {
        float v[ROW_UNROLL];
        row_load(x, i0, s1, __int_as_float(0xff800000), v);
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; u++) arg_better(v[u], i0 + u * blockDim.x, bv, bi);
    }
    block_argmax(bv, bi);
    float se = 0.f;
    if (probs) {
        // This block's own max (its argmax's value, or -inf when none beat it).
        const float mb = bi == 0x7fffffff ? __int_as_float(0xff800000) : bv;
        if (mb != __int_as_float(0xff800000))
            for (int i = s0 + threadIdx.x; i < s1; i += blockDim.x) se += expf(x[i] - mb);
        se = block_sum(se, sh);
    }
    float* pp = part + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * 4;
    if (threadIdx.x == 0) {
        pp[0] = bv;
        ((int*)pp)[1] = bi;
        pp[2] = se;
    }
    if (!last_of_row(counters)) return;
    const volatile float* rp = part + (size_t)blockIdx.x * gridDim.y * 4;
    bv = __int_as_float(0xff800000);
    bi = 0x7fffffff;
    const volatile int* rpi = (const volatile int*)rp;
    for (int b = threadIdx.x; b < (int)gridDim.y; b += blockDim.x) arg_better(rp[4 * b], rpi[4 * b + 1], bv, bi);
    block_argmax(bv, bi);
    const float mx = bi == 0x7fffffff ? x[0] : bv;
    if (threadIdx.x == 0) {
        const u32 pick = bi == 0x7fffffff ? 0u : (u32)bi;
        ids[blockIdx.x] = pick;
        if (feed) {
            const u32 p = feed[1];
            feed[0] = pick;
            feed[1] = p + 1;
            if (ring) ring[p & 1] = (unsigned long long)p << 32 | pick;
        }
    }
    if (!probs) return;
    float t = 0.f;
    for (int b = threadIdx.x; b < (int)gridDim.y; b += blockDim.x) {
        const float mb = rp[4 * b];
        if (rpi[4 * b + 1] != 0x7fffffff) t += rp[4 * b + 2] * expf(mb - mx);
    }
    t = block_sum(t, sh);
    if (threadIdx.x == 0) probs[blockIdx.x] = 1.f / t;
}

// The unsigned order of fkey(v) is f32::total_cmp's order of v (NaN above +inf, -0.0 below +0.0).
__device__ __forceinline__ u32 fkey(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
#define TOPK_CAP 2048
// The C largest logits of each segment of each row (width n, C <= 256) in f32::total_cmp order, ties in id order:
// the row's C largest are among its segments' lists, which the host merges (models::top_candidates' order). Each
// block takes one segment: every thread's largest value first; the C-th largest of those, T, has at least C logits
// of the segment at or above it, so the segment's C largest all are. Those (usually a few hundred) are gathered and
// each one's rank among them counted; ranks below C are written to out[(row * blocks + block) * C + rank] as keys
// (fkey << 32 | ~id: descending keys are descending logits, then ascending ids; 0 pads). flags[row * blocks + block]
// = 1 when more than TOPK_CAP logits of the segment are at or above T (ties; the host then selects from the whole
// row). Grid (rows, blocks), 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) topk_rows(const float* __restrict__ logits, int n, int C,
                                                             unsigned long long* __restrict__ out,
                                                             u32* __restrict__ flags) {
    PDL_ENTER
    __shared__ unsigned long long buf[TOPK_CAP];
    __shared__ u32 keys[1024];
    __shared__ int cnt;
    __shared__ u32 thr;
    const float* x = logits + (size_t)blockIdx.x * n;
    int s0, s1;
    row_segment(n, s0, s1);
    const int Cb = min(C, s1 - s0), tid = threadIdx.x;
    u32 v = 0;
    for (int i0 = s0 + tid; i0 < s1; i0 += ROW_UNROLL * blockDim.x) {
        float xv[ROW_UNROLL];
        row_load(x, i0, s1, 0.f, xv);
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; u++)
            if (i0 + u * blockDim.x < s1) v = max(v, fkey(xv[u]));
    }
    if (tid == 0) cnt = 0;
    // The 1,024 maxima sorted descending, one per thread (bitonic network: partners in the same warp by shuffles,
    // the others through shared memory); thread Cb - 1 then holds T.
    for (int k = 2; k <= 1024; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            u32 o;
            if (j >= 32) {
                keys[tid] = v;
                __syncthreads();
                o = keys[tid ^ j];
                __syncthreads();
            } else {
                o = __shfl_xor_sync(0xffffffffu, v, j);
            }
            v = (((tid & j) == 0) == ((tid & k) == 0)) ? max(v, o) : min(v, o);
        }
    if (tid == Cb - 1) thr = v;
    __syncthreads();
    const u32 T = thr;
    for (int i0 = s0 + tid; i0 < s1; i0 += ROW_UNROLL * blockDim.x) {
        float xv[ROW_UNROLL];
        row_load(x, i0, s1, 0.f, xv);
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; u++) {
            const int i = i0 + u * blockDim.x;
            const u32 k = fkey(xv[u]);
            if (i < s1 && k >= T && Cb > 0) {
                const int slot = atomicAdd(&cnt, 1);
                if (slot < TOPK_CAP) buf[slot] = ((unsigned long long)k << 32) | (u32)~(u32)i;
            }
        }
    }
    __syncthreads();
    const int m = cnt;
    unsigned long long* ob = out + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * C;
    if (tid == 0) flags[blockIdx.x * gridDim.y + blockIdx.y] = m > TOPK_CAP;
    if (m > TOPK_CAP) return;
    for (int j = Cb + tid; j < C; j += blockDim.x) ob[j] = 0;
    // Keys are distinct (the id is in them): each one's rank is the number of larger ones.
    for (int e = tid; e < m; e += blockDim.x) {
        const unsigned long long me = buf[e];
        int rank = 0;
        for (int f = 0; f < m; f++) rank += buf[f] > me;
        if (rank < Cb) ob[rank] = me;
    }
}
