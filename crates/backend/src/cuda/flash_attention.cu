// ---- Causal attention of one long chunk on tensor cores, FlashAttention-2 style (the prefill path).
//
// The chunk's m query rows (f32, rotated) sit at positions start .. start + m - 1 of one sequence; row i sees
// positions 0 ..= start + i of that sequence's paged f16 KV cache (pages of PAGE_SIZE positions, `[page][PAGE_SIZE]
// [KV_DIM]` per layer, page numbers in `table`), which already holds the chunk's own K and V. Rows of one KV head
// are flattened over (position, query head of the group): flattened row r is position r / FA_GROUP, head
// g * FA_GROUP + r % FA_GROUP, so every K/V tile a block loads serves all FA_GROUP query heads that read it. A block
// of FA_WARPS warps takes FA_BM flattened rows (16 per warp), walks the key tiles of FA_BN positions up to its last
// row's limit, and keeps the running max, sum and output of its rows in registers (online softmax in base 2, f32);
// S = Q K^T and O += P V are mma.sync m16n8k16 (f16 inputs, f32 accumulation) on fragments loaded with ldmatrix from
// shared memory, which cp.async fills (V of tile j while S of tile j is computed, K of tile j + 1 during P V).
// Positions past the chunk's end are zero-filled, never read. Numerics: Q rounded to f16 and clamped to its range
// (as the GEMM path's to_f16 did), scores in f32 scaled by 1/sqrt(HEAD_DIM) after the product, P rounded to f16
// before P V, normalised at the end.
//
// Grid (NUM_KV_HEADS, row blocks, splits). With one split the block writes its rows' output to `out` ([m][Q_DIM],
// f32). With several (a short chunk after a long context, where row blocks alone would leave the GPU idle), split z
// takes the key tiles from z * keys_per_split / FA_BN on and writes its normalised partial output to
// part[z][m][NUM_HEADS][HEAD_DIM] and the log2 of its softmax denominator (max included) to lse[z][m][NUM_HEADS];
// flash_combine then merges the splits. Row blocks run heaviest (latest positions) first.

#define FA_GROUP (NUM_HEADS / NUM_KV_HEADS)
#ifndef FA_WARPS
#define FA_WARPS 4
#endif
#define FA_BM (16 * FA_WARPS)
#define FA_BN (HEAD_DIM <= 128 ? 64 : 32)
// Shared-memory row stride in halves: consecutive rows 16 bytes apart modulo 128, so ldmatrix's eight row reads of
// one 8x8 matrix hit distinct banks.
#define FA_LD (HEAD_DIM + 8)
#define FA_NEG_INF __int_as_float(0xff800000)

static_assert(HEAD_DIM % 16 == 0, "flash_attention needs HEAD_DIM a multiple of 16");
static_assert(NUM_HEADS % NUM_KV_HEADS == 0, "query heads must be a multiple of KV heads");
static_assert(PAGE_SIZE % FA_BN == 0, "a key tile must lie inside one page");

__device__ __forceinline__ u32 fa_smem(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// Two floats as f16x2: lo in the low half (the lower column of an mma fragment).
__device__ __forceinline__ u32 fa_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x (MUFU; 2^-inf = 0).
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void fa_ldsm(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void fa_ldsm_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// c (16x8, f32) += a (16x16, f16, row-major) b (16x8, f16, column-major).
__device__ __forceinline__ void fa_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Positions kt * FA_BN .. + FA_BN of KV head g from the paged cache into dst ([FA_BN][FA_LD] halves), 16 bytes
// per cp.async; positions from n_keys on are zero-filled (nothing is read for them).
__device__ __forceinline__ void fa_load_tile(u16* dst, const u16* __restrict__ cache, const u32* __restrict__ table,
                                             int g, int kt, int n_keys) {
    constexpr int CH = HEAD_DIM / 8;
    static_assert(FA_BN * CH % (FA_WARPS * 32) == 0, "the tile's 16-byte pieces split evenly over the threads");
#pragma unroll
    for (int i = 0; i < FA_BN * CH / (FA_WARPS * 32); i++) {
        const int c = threadIdx.x + i * FA_WARPS * 32;
        const int r = c / CH, col = c % CH, key = kt * FA_BN + r;
        const bool ok = key < n_keys;
        const u16* src = cache;
        if (ok) src = cache + ((size_t)table[key / PAGE_SIZE] * PAGE_SIZE + key % PAGE_SIZE) * KV_DIM + g * HEAD_DIM + col * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(fa_smem(dst + r * FA_LD + col * 8)), "l"(src),
                     "r"(ok ? 16 : 0)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void fa_wait_tiles() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)
    flash_attention(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
                    const u32* __restrict__ table, float* __restrict__ out, float* __restrict__ part,
                    float* __restrict__ lse, int m, int start, int keys_per_split) { PDL_ENTER
    __shared__ __align__(16) u16 ks[FA_BN * FA_LD];
    __shared__ __align__(16) u16 vs[FA_BN * FA_LD];
    const int g = blockIdx.x, split = blockIdx.z;
    const int r0 = (gridDim.y - 1 - blockIdx.y) * FA_BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qr = lane >> 2, qc = lane & 3;  // the fragment's row (groupID) and column pair (threadID_in_group)
    const int rows = m * FA_GROUP;
    const int t_lo = r0 / FA_GROUP, t_hi = min(m - 1, (r0 + FA_BM - 1) / FA_GROUP);
    const int n_keys = start + t_hi + 1;
    const int tiles = (n_keys + FA_BN - 1) / FA_BN;
    const int kt0 = split * (keys_per_split / FA_BN), kt1 = min(tiles, kt0 + keys_per_split / FA_BN);
    // This thread's two rows (fragment rows qr and qr + 8 of its warp's 16): their positions' limits.
    const int ra = r0 + warp * 16 + qr;
    int lim[2];
    const float* qp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = ra + 8 * h;
        lim[h] = start + r / FA_GROUP;
        qp[h] = r < rows ? q + (size_t)(r / FA_GROUP) * Q_DIM + (g * FA_GROUP + r % FA_GROUP) * HEAD_DIM : nullptr;
    }
    // Q as A fragments, rounded to f16: [k-step][a0..a3] = (row qr, cols 2qc..), (qr + 8, 2qc..), (qr, 2qc + 8..),
    // (qr + 8, 2qc + 8..).
    u32 qa[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float* p = qp[j & 1];
            float2 v;
            v.x = 0.f;
            v.y = 0.f;
            if (p) v = *(const float2*)(p + kk * 16 + (j >> 1) * 8 + 2 * qc);
            qa[kk][j] = fa_h2(fminf(fmaxf(v.x, -65504.f), 65504.f), fminf(fmaxf(v.y, -65504.f), 65504.f));
        }
    }
    const float sl2 = 1.4426950408889634f / sqrtf((float)HEAD_DIM);
    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float mx[2] = {FA_NEG_INF, FA_NEG_INF}, sum[2] = {0.f, 0.f};
    // ldmatrix: lane supplies the address of row (lane & 7) of 8x8 matrix (lane >> 3).
    const int lm = lane >> 3, lr = lane & 7;
    if (kt0 < kt1) fa_load_tile(ks, kc, table, g, kt0, n_keys);
    for (int kt = kt0; kt < kt1; kt++) {
        fa_wait_tiles();
        __syncthreads();  // K(kt) is in; every warp is done with V(kt - 1)
        fa_load_tile(vs, vc, table, g, kt, n_keys);
        float s[FA_BN / 8][4];
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
#pragma unroll
            for (int j = 0; j < FA_BN / 8; j += 2) {
                u32 b0, b1, b2, b3;
                fa_ldsm(fa_smem(ks + ((j + (lm >> 1)) * 8 + lr) * FA_LD + kk * 16 + (lm & 1) * 8), b0, b1, b2, b3);
                fa_mma(s[j], qa[kk], b0, b1);
                fa_mma(s[j + 1], qa[kk], b2, b3);
            }
        }
        // Scale to base 2, mask positions past each row's limit (only tiles that reach past the block's first row),
        // new running max per row (over the four threads of the row).
        const int key0 = kt * FA_BN;
        const bool edge = key0 + FA_BN - 1 > start + t_lo;
        float tmax[2] = {mx[0], mx[1]};
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[j][e] * sl2;
                if (edge && key0 + j * 8 + 2 * qc + (e & 1) > lim[e >> 1]) v = FA_NEG_INF;
                s[j][e] = v;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
            }
        }
        float base[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
            // A row with every position so far masked keeps max -inf; subtract 0 then (exp2(-inf) = 0, no NaN).
            base[h] = tmax[h] == FA_NEG_INF ? 0.f : tmax[h];
            const float alpha = fa_exp2(mx[h] - base[h]);
            mx[h] = tmax[h];
            sum[h] *= alpha;
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n++) {
                o[n][2 * h] *= alpha;
                o[n][2 * h + 1] *= alpha;
            }
        }
        // P as A fragments of the P V product (k = position): tile j's accumulators are columns 8 (j & 1) .. of
        // k-step j / 2.
        u32 pa[FA_BN / 16][4];
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++) {
            const float p0 = fa_exp2(s[j][0] - base[0]), p1 = fa_exp2(s[j][1] - base[0]);
            const float p2 = fa_exp2(s[j][2] - base[1]), p3 = fa_exp2(s[j][3] - base[1]);
            sum[0] += p0 + p1;
            sum[1] += p2 + p3;
            pa[j >> 1][(j & 1) * 2] = fa_h2(p0, p1);
            pa[j >> 1][(j & 1) * 2 + 1] = fa_h2(p2, p3);
        }
        fa_wait_tiles();
        __syncthreads();  // V(kt) is in; every warp is done with K(kt)
        if (kt + 1 < kt1) fa_load_tile(ks, kc, table, g, kt + 1, n_keys);
#pragma unroll
        for (int k2 = 0; k2 < FA_BN / 16; k2++) {
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n += 2) {
                u32 b0, b1, b2, b3;
                fa_ldsm_t(fa_smem(vs + (k2 * 16 + (lm & 1) * 8 + lr) * FA_LD + (n + (lm >> 1)) * 8), b0, b1, b2, b3);
                fa_mma(o[n], pa[k2], b0, b1);
                fa_mma(o[n + 1], pa[k2], b2, b3);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
        const int r = ra + 8 * h;
        if (r >= rows) continue;
        const int t = r / FA_GROUP, head = g * FA_GROUP + r % FA_GROUP;
        const float inv = sum[h] > 0.f ? 1.f / sum[h] : 0.f;
        float* dst = gridDim.z == 1 ? out + (size_t)t * Q_DIM + head * HEAD_DIM
                                    : part + ((size_t)(split * m + t) * NUM_HEADS + head) * HEAD_DIM;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; n++) {
            float2 v;
            v.x = o[n][2 * h] * inv;
            v.y = o[n][2 * h + 1] * inv;
            *(float2*)(dst + n * 8 + 2 * qc) = v;
        }
        if (gridDim.z > 1 && qc == 0)
            lse[(size_t)(split * m + t) * NUM_HEADS + head] = sum[h] > 0.f ? mx[h] + log2f(sum[h]) : FA_NEG_INF;
    }
}

// The splits of flash_attention merged: out[t][h] = sum_z 2^(lse_z - M) part_z / sum_z 2^(lse_z - M), M the largest
// lse_z. Grid (m, NUM_HEADS), HEAD_DIM threads.
extern "C" __global__ void flash_combine(const float* __restrict__ part, const float* __restrict__ lse,
                                         float* __restrict__ out, int m, int splits) { PDL_ENTER
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    float mx = FA_NEG_INF;
    for (int z = 0; z < splits; z++) mx = fmaxf(mx, lse[(size_t)(z * m + t) * NUM_HEADS + h]);
    float acc = 0.f, w = 0.f;
    for (int z = 0; z < splits; z++) {
        const float l = lse[(size_t)(z * m + t) * NUM_HEADS + h];
        if (l == FA_NEG_INF) continue;
        const float wz = fa_exp2(l - mx);
        w += wz;
        acc += wz * part[((size_t)(z * m + t) * NUM_HEADS + h) * HEAD_DIM + d];
    }
    out[(size_t)t * Q_DIM + h * HEAD_DIM + d] = w > 0.f ? acc / w : 0.f;
}
