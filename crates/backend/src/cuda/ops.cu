// The primitive ops of `CudaBackend` (backend.rs): every shape a runtime argument, so one small module serves every
// model and every test shape (kernels.cu is the runner's library, specialised per model at compile time). f32
// activations, f32 weights (dequantized at load), KV blocks in the `KvLayout` form (f16 values, or f32 ones for an
// f32 cache: `kv_f32`). After prelude.cu.

// Value i of a KV buffer of f16 or (kv_f32) f32 values.
__device__ __forceinline__ float kv_load(const u16* kv, size_t i, int kv_f32) {
    return kv_f32 ? ((const float*)kv)[i] : h2f(kv[i]);
}
__device__ __forceinline__ void kv_store(u16* kv, size_t i, float v, int kv_f32) {
    if (kv_f32)
        ((float*)kv)[i] = v;
    else
        kv[i] = f2h(v);
}

// Sum (max) over a block of blockDim.x threads (a multiple of 32, at most 1024), returned to every thread.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[warp] = v;
    __syncthreads();
    float r = part[0];
    for (int i = 1; i < nw; i++) r = is_max ? fmaxf(r, part[i]) : r + part[i];
    return r;
}

// out[i] = src[idx[i]] for rows of `cols` (embedding lookups and row gathers). Grid: one block per output row.
extern "C" __global__ void gather(const float* __restrict__ src, const u32* __restrict__ idx, float* __restrict__ out,
                                  int cols) {
    const float* s = src + (size_t)idx[blockIdx.x] * cols;
    float* o = out + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = s[i];
}

extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// silu(g) * u in place of g.
extern "C" __global__ void swiglu(float* __restrict__ g, const float* __restrict__ u, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = g[i];
        g[i] = v / (1.f + expf(-v)) * u[i];
    }
}

// RMSNorm of each run of `dim` values (one block per run; `out` may be `x`). one_plus: weights stored as w - 1.
extern "C" __global__ void rms_norm(const float* x, const float* __restrict__ w, float* out, int dim, float eps,
                                    int one_plus) {
    const float* r = x + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += r[i] * r[i];
    const float s = rsqrtf(block_reduce(ss, false) / dim + eps);
    float* o = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = r[i] * s * (one_plus ? 1.f + w[i] : w[i]);
}

// Y[t, j] = W[j] . X[t] (+ bias[j]), W `[N, K]` f32. One warp per (j, t): grid (ceil(N / 4), m), 128 threads.
extern "C" __global__ void matvec(const float* __restrict__ W, const float* __restrict__ X,
                                  const float* __restrict__ bias, float* __restrict__ Y, int N, int K) {
    const int j = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y, lane = threadIdx.x & 31;
    if (j >= N) return;
    const float* w = W + (size_t)j * K;
    const float* x = X + (size_t)t * K;
    float acc = 0.f;
    for (int i = lane; i < K; i += 32) acc += w[i] * x[i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) Y[(size_t)t * N + j] = acc + (bias ? bias[j] : 0.f);
}

// RoPE in place over row t (one block per row) of `cols` values at position pos[t]: pair i of every head rotated by
// pos * step^i (the running product in f32, as ggml and the CPU backend), `rope_dim` of each head's `head_dim`.
extern "C" __global__ void rope(float* __restrict__ x, const u32* __restrict__ pos, int cols, int head_dim,
                                int rope_dim, float step, int neox) {
    const int half = rope_dim / 2, pairs = cols / head_dim * half;
    float* r = x + (size_t)blockIdx.x * cols;
    const float p = (float)pos[blockIdx.x];
    for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float f = 1.f;
        for (int j = 0; j < i; j++) f *= step;
        float s, c;
        sincosf(p * f, &s, &c);
        float* hd = r + h * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float va = hd[a], vb = hd[b];
        hd[a] = va * c - vb * s;
        hd[b] = va * s + vb * c;
    }
}

// Writes row t's key and value (f16, or f32 when kv_f32) to its slot: slots[2t] the block, slots[2t + 1] the row in
// it. `layer_k`: the layer's keys' offset in a block (values follow `block_tokens * kv_dim` later), in values.
extern "C" __global__ void kv_write(u16* __restrict__ kv, const float* __restrict__ k, const float* __restrict__ v,
                                    const u32* __restrict__ slots, int kv_dim, int block_tokens, int block_values,
                                    int layer_k, int kv_f32) {
    const int t = blockIdx.x;
    const size_t dst = (size_t)slots[2 * t] * block_values + layer_k + (size_t)slots[2 * t + 1] * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kv_store(kv, dst + i, k[(size_t)t * kv_dim + i], kv_f32);
        kv_store(kv, dst + (size_t)block_tokens * kv_dim + i, v[(size_t)t * kv_dim + i], kv_f32);
    }
}

// Causal attention of row t (blockIdx.x), head h (blockIdx.y) over positions 0..=row[2t] of its sequence, whose
// blocks are tables[row[2t + 1] ..]: query rounded to f16 over an f16 cache (f32 over an f32 one, kv_f32), scores in
// f32 through `scores` (`ctx` per (row, head)), softmax, then the weighted sum of the values. 128 threads; head_dim
// at most 256.
extern "C" __global__ void attention(const float* __restrict__ q, const u16* __restrict__ kv,
                                     const u32* __restrict__ row, const u32* __restrict__ tables,
                                     float* __restrict__ scores, float* __restrict__ out, int num_heads,
                                     int num_kv_heads, int head_dim, float scale, int block_tokens, int block_values,
                                     int layer_k, int ctx, int kv_f32) {
    __shared__ float qs[256];
    const int t = blockIdx.x, h = blockIdx.y, kv_dim = num_kv_heads * head_dim;
    const int g = h / (num_heads / num_kv_heads), n = row[2 * t] + 1;
    const u32* table = tables + row[2 * t + 1];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        qs[d] = kv_f32 ? q[((size_t)t * num_heads + h) * head_dim + d]
                       : h2f(f2h(q[((size_t)t * num_heads + h) * head_dim + d]));
    __syncthreads();
    float* sc = scores + ((size_t)t * num_heads + h) * ctx;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const size_t off_k = layer_k + (size_t)g * head_dim;
    for (int p = warp; p < n; p += nw) {
        const size_t key = (size_t)table[p / block_tokens] * block_values + off_k + (size_t)(p % block_tokens) * kv_dim;
        float s = 0.f;
        for (int d = lane; d < head_dim; d += 32) s += kv_load(kv, key + d, kv_f32) * qs[d];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sc[p] = s * scale;
    }
    __syncthreads();
    float mx = __int_as_float(0xff800000);
    for (int p = threadIdx.x; p < n; p += blockDim.x) mx = fmaxf(mx, sc[p]);
    mx = block_reduce(mx, true);
    float sum = 0.f;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    const size_t off_v = off_k + (size_t)block_tokens * kv_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.f;
        for (int p = 0; p < n; p++)
            acc += sc[p] * kv_load(kv, (size_t)table[p / block_tokens] * block_values + off_v +
                                           (size_t)(p % block_tokens) * kv_dim + d, kv_f32);
        out[((size_t)t * num_heads + h) * head_dim + d] = acc / sum;
    }
}
