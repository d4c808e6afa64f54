// The expert-routed FFN of `CudaBackend` (backend/experts.rs), after ops.cu: routing on the device, the rows sorted
// by expert on the device, then grouped matrix-vector products whose blocks each take one expert and read its weight
// rows once for every MOE_TILE rows that picked it (a decode or verification pass: once), the mix in the router's
// slot order. Every shape is a run-time argument (numbers, never a model); f32 weights and activations.
//
// A row's result does not depend on the other rows of the call: each product is one warp's sum over the input in
// lane order, whatever tile slot the row sits in.

#define MOE_TILE 8
// Experts a router may have (its probabilities sit in shared memory).
#define MOE_MAX_EXPERTS 1024

// The picks of row blockIdx.x of `logits` ([m, ne]): softmax over the ne experts, the k largest (ties to the lower
// index; NaN never picked while a number is left), in order of decreasing probability: pick_e / pick_w
// [m * k], the weights renormalised to sum to 1 when `norm`. One warp per row. (The bodies are device functions so
// that the fused runner's library, moe.cu, wraps them with its programmatic-dependent-launch wait.)
__device__ __forceinline__ void moe_route_body(const float* __restrict__ logits, int ne, int k, int norm,
                                               u32* __restrict__ pick_e, float* __restrict__ pick_w) {
    __shared__ float p[MOE_MAX_EXPERTS];
    const int lane = threadIdx.x;
    const float* l = logits + (size_t)blockIdx.x * ne;
    float mx = __int_as_float(0xff800000);
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int e = lane; e < ne; e += 32) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncwarp();
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        // This lane's best (the first of its largest), then the warp's: larger value, else lower index.
        float bv = -1.f;
        int be = -1;
        for (int e = lane; e < ne; e += 32)
            if (p[e] >= 0.f && (be < 0 || p[e] > bv)) bv = p[e], be = e;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
        }
        // Only NaN (or picked) left: expert 0, as the CPU backend.
        if (be < 0) be = 0;
        const float w = p[be] / sum;
        total += w;
        if (lane == 0) {
            pick_e[(size_t)blockIdx.x * k + j] = be;
            pick_w[(size_t)blockIdx.x * k + j] = w;
        }
        __syncwarp();
        if (lane == 0) p[be] = -1.f;
        __syncwarp();
    }
    if (norm)
        for (int j = lane; j < k; j += 32) pick_w[(size_t)blockIdx.x * k + j] /= total;
}
extern "C" __global__ void moe_route(const float* __restrict__ logits, int ne, int k, int norm,
                                     u32* __restrict__ pick_e, float* __restrict__ pick_w) {
    moe_route_body(logits, ne, k, norm, pick_e, pick_w);
}

// The n = m * k assignments (a = row * k + slot) sorted by expert, stably: offsets [ne + 1] (expert e's assignments
// at offsets[e] .. offsets[e + 1]), order[p] = a, at[a] = p; where given, tok[p] = a / k (the row of assignment p)
// and used = [count, the experts some assignment picked, in increasing order]. One block.
__device__ __forceinline__ void moe_group_body(const u32* __restrict__ pick_e, int n, int ne, int k,
                                               u32* __restrict__ offsets, u32* __restrict__ order, u32* __restrict__ at,
                                               u32* __restrict__ tok, u32* __restrict__ used) {
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        u32 c = 0;
        for (int a = 0; a < n; a++) c += pick_e[a] == (u32)e;
        offsets[e + 1] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offsets[0] = 0;
        u32 c = 0;
        for (int e = 0; e < ne; e++) {
            if (used && offsets[e + 1] > 0) used[1 + c++] = e;
            offsets[e + 1] += offsets[e];
        }
        if (used) used[0] = c;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        u32 q = offsets[e];
        for (int a = 0; a < n; a++)
            if (pick_e[a] == (u32)e) {
                order[q] = a, at[a] = q;
                if (tok) tok[q] = a / k;
                q++;
            }
    }
}
extern "C" __global__ void moe_group(const u32* __restrict__ pick_e, int n, int ne, int k, u32* __restrict__ offsets,
                                     u32* __restrict__ order, u32* __restrict__ at, u32* __restrict__ tok,
                                     u32* __restrict__ used) {
    moe_group_body(pick_e, n, ne, k, offsets, order, at, tok, used);
}

// Sums of one warp: acc[i] over the lanes, for the first `count` of MOE_TILE.
__device__ __forceinline__ void moe_warp_sums(float* acc, int count) {
#pragma unroll
    for (int i = 0; i < MOE_TILE; i++) {
        if (i < count)
            for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    }
}

// hid[p, j] = silu(gate_e[j] . x[t]) * (up_e[j] . x[t]) for expert e = blockIdx.y and each of its assignments p
// (row t = order[p] / k), j < f. Expert e's gate row j is gate[(e * stride + j) * K] (up likewise from `up`): stride
// f for separate gate and up matrices, 2f for a fused one (up = gate + f rows). One warp per j: grid
// (ceil(f / 4), ne), 128 threads.
extern "C" __global__ void moe_gate_up(const float* __restrict__ gate, const float* __restrict__ up, int stride,
                                       const float* __restrict__ x, const u32* __restrict__ offsets,
                                       const u32* __restrict__ order, int k, int f, int K, float* __restrict__ hid) {
    const int e = blockIdx.y, j = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int p0 = offsets[e], p1 = offsets[e + 1];
    if (p0 == p1 || j >= f) return;
    const float* g = gate + ((size_t)e * stride + j) * K;
    const float* u = up + ((size_t)e * stride + j) * K;
    for (int tile = p0; tile < p1; tile += MOE_TILE) {
        const int count = min(MOE_TILE, p1 - tile);
        const float* xr[MOE_TILE];
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) xr[i] = x + (size_t)(order[tile + min(i, count - 1)] / k) * K;
        float ag[MOE_TILE], au[MOE_TILE];
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) ag[i] = au[i] = 0.f;
        for (int c = lane; c < K; c += 32) {
            const float gv = g[c], uv = u[c];
#pragma unroll
            for (int i = 0; i < MOE_TILE; i++) {
                if (i < count) {
                    const float xv = xr[i][c];
                    ag[i] += gv * xv;
                    au[i] += uv * xv;
                }
            }
        }
        moe_warp_sums(ag, count);
        moe_warp_sums(au, count);
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < MOE_TILE; i++)
                if (i < count) hid[(size_t)(tile + i) * f + j] = ag[i] / (1.f + expf(-ag[i])) * au[i];
        }
    }
}

// y[p, o] = down_e[o] . hid[p] for expert e = blockIdx.y and each of its assignments p, o < H; expert e's row o is
// down[(e * H + o) * f]. One warp per o: grid (ceil(H / 4), ne), 128 threads.
extern "C" __global__ void moe_down(const float* __restrict__ down, const float* __restrict__ hid,
                                    const u32* __restrict__ offsets, int H, int f, float* __restrict__ y) {
    const int e = blockIdx.y, o = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int p0 = offsets[e], p1 = offsets[e + 1];
    if (p0 == p1 || o >= H) return;
    const float* d = down + ((size_t)e * H + o) * f;
    for (int tile = p0; tile < p1; tile += MOE_TILE) {
        const int count = min(MOE_TILE, p1 - tile);
        float acc[MOE_TILE];
#pragma unroll
        for (int i = 0; i < MOE_TILE; i++) acc[i] = 0.f;
        for (int c = lane; c < f; c += 32) {
            const float dv = d[c];
#pragma unroll
            for (int i = 0; i < MOE_TILE; i++)
                if (i < count) acc[i] += dv * hid[(size_t)(tile + i) * f + c];
        }
        moe_warp_sums(acc, count);
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < MOE_TILE; i++)
                if (i < count) y[(size_t)(tile + i) * H + o] = acc[i];
        }
    }
}

// out[t] = sum over slots j, in order, of pick_w[t * k + j] * y[at[t * k + j]], plus sc * shared[t] when `shared` is
// given (sc = sigmoid(z[t]) when `z` is, else 1). One block per row t.
extern "C" __global__ void moe_mix(const float* __restrict__ y, const u32* __restrict__ at,
                                   const float* __restrict__ pick_w, int k, int H, const float* __restrict__ shared,
                                   const float* __restrict__ z, float* __restrict__ out) {
    const int t = blockIdx.x;
    const float sc = z ? 1.f / (1.f + expf(-z[t])) : 1.f;
    for (int o = threadIdx.x; o < H; o += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += pick_w[(size_t)t * k + j] * y[(size_t)at[(size_t)t * k + j] * H + o];
        if (shared) acc += sc * shared[(size_t)t * H + o];
        out[(size_t)t * H + o] = acc;
    }
}
