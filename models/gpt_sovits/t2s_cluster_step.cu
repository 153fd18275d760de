// The T2S decode step at batch 1 as one persistent kernel of thread-block clusters (sm_90).
//
// One cluster of CLUSTER CTAs per attention head (4 or 8; the engine picks), every CTA resident at once
// (the grid barriers need it). Per layer:
//
//   attend  (after the grid barrier that closes the previous layer's FFN)
//           every CTA: the layer input (LayerNorm 2 of the previous sum 2, or the embedding);
//           CTA r of head h: rows r*QKV_ROWS.. of the head's q, k and v; k, v into the cache;
//           cluster barrier; every CTA gathers the head's whole q, k_new, v_new from the others'
//           shared memory (DSMEM) and makes the softmax partial of its chunk of cached positions
//           (the last CTA adds the new position); cluster barrier; every CTA merges the head's
//           partials from DSMEM and adds its OUT_ROWS rows of W_o[:, head] . attention into sum 1
//           (the lead head adds the out bias and the layer input).
//   ffn     (after a grid barrier) every CTA: LayerNorm 1 of sum 1, relu(W_1 . + b_1) for its
//           UNITS hidden units, W_2's columns for them times that: a partial of sum 2, added in.
//   (after the last layer's FFN and a grid barrier) logits = W_p LayerNorm 2(sum 2), VOCAB rows
//   spread over the CTAs.
//
// Where the Triton step (engine_persistent.py) combines a head's partials through L2 (a release,
// an atomic counter, the partials' loads, then the W_o tile's load by whichever program came last),
// here they meet in shared memory behind the cluster's hardware barrier, and each CTA's W_o rows are
// known in advance. Every weight tile, and the first block of cached keys and values, is copied into
// shared memory a phase ahead: weights never depend on the step, so the copies run behind the
// previous phase's work, and after a barrier only activations are read from L2. How (one of three):
//   default             cp.async copies by every thread, issued before the grid barrier's wait;
//   COPY_AFTER_RELEASE  the same, issued once the barrier released (after the sums' loads): copies
//                       issued ahead of the poll delayed the barrier by about 1 us on an H100;
//   BULK_COPIES         one warp issues the weight tiles as bulk copies of repacked, contiguous tiles
//                       into an mbarrier; the cached keys and values stay cp.async copies.
//
// Sums that many CTAs add into are kept as REPLICAS_1 (sum 1) and REPLICAS_2 (sum 2) rows of D
// floats, summed where they are read, so fewer float atomics queue on one address; the float order
// of those additions varies from run to run, so sums vary in their last float32 bits.
//
// Compile-time constants (-D): D, H, HD, FFN, VOCAB, LAYERS, CLUSTER, KV_BLOCK, REPLICAS_1,
// REPLICAS_2, MAX_LEN, MAX_POSITION, SPIN_LIMIT, EPS, TIMELINE, COPY_AFTER_RELEASE, BULK_COPIES.
// Weights, biases, norms, embeddings and the cache are FP16; activations and sums float32.

typedef unsigned short half_t;

#define NEG_INF (-__int_as_float(0x7f800000))

#define THREADS 256
#define WARPS (THREADS / 32)

constexpr int CTAS = H * CLUSTER;
constexpr int QKV_ROWS = HD / CLUSTER;          // rows of each of q, k, v a CTA makes
constexpr int OUT_ROWS = D / CLUSTER;           // rows of W_o[:, head] a CTA applies
constexpr int UNITS = FFN / CTAS;               // hidden units a CTA takes in the FFN
constexpr int VOCAB_BASE = VOCAB / CTAS;        // logits rows a CTA takes (the first VOCAB % CTAS one more)
constexpr int VOCAB_EXTRA = VOCAB % CTAS;
constexpr int VOCAB_ROWS = VOCAB_BASE + (VOCAB_EXTRA ? 1 : 0);
constexpr int PER_THREAD = D / THREADS;         // elements of a D row each thread holds

static_assert(HD == 32, "a head's 32 dimensions: one per lane");
static_assert(PER_THREAD == 2, "row vectors are read as one float2 per thread");
constexpr int OUT_THREADS = THREADS / OUT_ROWS;  // threads sharing a W_o row, HD / OUT_THREADS halves each
static_assert(QKV_ROWS * CLUSTER == HD, "q, k, v rows split evenly over the cluster");
static_assert(OUT_ROWS * CLUSTER == D && OUT_THREADS * OUT_ROWS == THREADS && HD % (8 * OUT_THREADS) == 0,
              "a W_o row's HD halves split over OUT_THREADS threads in 16-byte runs");
static_assert(UNITS * CTAS == FFN && UNITS % 8 == 0 && UNITS % WARPS == 0,
              "a CTA's hidden units: whole 16-byte runs of each W_2 row, as many for every warp");
static_assert(D % 256 == 0, "a D row is read as two 8-half runs per lane");

// Shared memory, in halves then floats (offsets in bytes, each a multiple of 16).
constexpr int SM_QKV_W = 0;                                        // (3 * QKV_ROWS, D) halves; the logits tile
constexpr int SM_OUT_W = SM_QKV_W + 2 * (3 * QKV_ROWS > VOCAB_ROWS ? 3 * QKV_ROWS : VOCAB_ROWS) * D;
constexpr int SM_KV = SM_OUT_W + 2 * OUT_ROWS * HD;                // keys (KV_BLOCK, HD) then values
constexpr int SM_FFN1_W = SM_KV + 2 * 2 * KV_BLOCK * HD;           // (UNITS, D)
constexpr int SM_FFN2_W = SM_FFN1_W + 2 * UNITS * D;               // (D, UNITS); BULK_COPIES: W_2 transposed, (UNITS, D)
constexpr int SM_QKV_B = SM_FFN2_W + 2 * D * UNITS;                // the head's q, k, v biases (3 * HD halves)
constexpr int SM_OUT_B = SM_QKV_B + 2 * 3 * HD;                    // OUT_ROWS halves
constexpr int SM_NORM2 = SM_OUT_B + 2 * OUT_ROWS;                  // gamma, beta (D each) of the previous layer
constexpr int SM_FFN1_B = SM_NORM2 + 2 * 2 * D;                    // UNITS halves
constexpr int SM_FFN2_B = SM_FFN1_B + 2 * UNITS;                   // D halves
constexpr int SM_NORM1 = SM_FFN2_B + 2 * D;                        // gamma, beta (D each)
constexpr int SM_X = SM_NORM1 + 2 * 2 * D;                         // floats from here: the layer input (D)
constexpr int SM_X1 = SM_X + 4 * D;                                // the FFN input (D)
constexpr int SM_SLICE = SM_X1 + 4 * D;                            // this CTA's q, k, v rows (3 * QKV_ROWS)
constexpr int SM_GATHERED = SM_SLICE + 4 * 3 * QKV_ROWS;           // the head's q, k_new, v_new (3 * HD)
constexpr int SM_PARTIAL = SM_GATHERED + 4 * 3 * HD;               // max, weight sum, then HD weighted values
constexpr int SM_ATTN = SM_PARTIAL + 4 * (4 + HD);                 // the head's attention output (HD)
constexpr int SM_SCORES = SM_ATTN + 4 * HD;                        // KV_BLOCK + 1 scores, then their weights (padded)
constexpr int SM_ACC = SM_SCORES + 4 * (KV_BLOCK + 4);             // (THREADS / HD, HD) partial sums of weighted values
constexpr int SM_HIDDEN = SM_ACC + 4 * THREADS;                    // UNITS floats
constexpr int SM_RED = SM_HIDDEN + 4 * UNITS;                      // 2 x WARPS floats for block sums
constexpr int SM_MBAR = SM_RED + 4 * 2 * WARPS;                    // two mbarriers (8 bytes each): attend, ffn
constexpr int SHARED_BYTES = SM_MBAR + 16;

// The layout's size, for the host to read from the PTX (``.const`` initialiser) and launch with.
extern "C" __constant__ int shared_bytes_layout = SHARED_BYTES;

// ---- small device helpers ------------------------------------------------------------------------

__device__ __forceinline__ float h2f(half_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ half_t f2h(float f) { half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ unsigned smem_address(const void* pointer) {
    return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void copy16(void* shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_address(shared)), "l"(global) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
}

// rows x row_bytes from global rows src_stride_bytes apart into packed shared rows, 16 bytes a copy.
__device__ __forceinline__ void copy_rows(void* shared, const void* global, int rows, int row_bytes,
                                          long long src_stride_bytes) {
    const int per_row = row_bytes / 16;
    for (int index = threadIdx.x; index < rows * per_row; index += THREADS) {
        const int row = index / per_row, column = index % per_row;
        copy16(static_cast<char*>(shared) + row * row_bytes + column * 16,
               static_cast<const char*>(global) + row * src_stride_bytes + column * 16);
    }
}

// Activations other CTAs wrote during this step: read from L2, never a stale L1 line.
__device__ __forceinline__ float2 load_l2(const float* pointer) {
    float2 value;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(value.x), "=f"(value.y) : "l"(pointer) : "memory");
    return value;
}

__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}
__device__ __forceinline__ float warp_max(float value) {
    for (int offset = 16; offset; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

// Sum over the CTA. ``scratch``: WARPS floats no other thread reads until the next block barrier.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
    value = warp_sum(value);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = value;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int warp = 0; warp < WARPS; ++warp) total += scratch[warp];
    return total;
}

// Maximum over the CTA, as ``block_sum``.
__device__ __forceinline__ float block_max(float value, float* scratch) {
    value = warp_max(value);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = value;
    __syncthreads();
    float best = scratch[0];
#pragma unroll
    for (int warp = 1; warp < WARPS; ++warp) best = fmaxf(best, scratch[warp]);
    return best;
}

// Dot of 8 halves (a 16-byte run) with 8 floats.
__device__ __forceinline__ float dot8(uint4 packed, const float* x) {
    const half_t* h = reinterpret_cast<const half_t*>(&packed);
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) total = fmaf(h2f(h[i]), x[i], total);
    return total;
}

// A D-wide row (shared halves) times x, where each lane holds x at lane*8.. and D/2 + lane*8.. (and
// so on for wider D): the warp's sum, in every lane.
__device__ __forceinline__ float row_dot(const half_t* row, const float (&x)[D / 32]) {
    const uint4* runs = reinterpret_cast<const uint4*>(row);
    const int lane = threadIdx.x & 31;
    float total = 0.f;
#pragma unroll
    for (int part = 0; part < D / 256; ++part) total += dot8(runs[part * 32 + lane], x + part * 8);
    return warp_sum(total);
}

__device__ __forceinline__ void lane_slice(const float* x, float (&out)[D / 32]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int part = 0; part < D / 256; ++part)
#pragma unroll
        for (int i = 0; i < 8; ++i) out[part * 8 + i] = x[part * 256 + lane * 8 + i];
}

// LayerNorm of the thread's two values (at dims 2t, 2t + 1) into ``out`` (shared, D floats).
__device__ __forceinline__ void layer_norm(float2 value, const half_t* gamma, const half_t* beta, float* out,
                                           float* scratch) {
    const float mean = block_sum(value.x + value.y, scratch) * (1.f / D);
    const float a = value.x - mean, b = value.y - mean;
    const float variance = block_sum(a * a + b * b, scratch + WARPS) * (1.f / D);
    const float rstd = rsqrtf(variance + EPS);
    const int dim = 2 * threadIdx.x;
    out[dim] = a * rstd * h2f(gamma[dim]) + h2f(beta[dim]);
    out[dim + 1] = b * rstd * h2f(gamma[dim + 1]) + h2f(beta[dim + 1]);
}

// A row of REPLICAS x D floats that CTAs added into: the thread's two dims of each replica, loaded
// (``load_replicas``) apart from their sum (``sum_replicas``), so that other requests can be issued
// while the loads travel.
template <int REPLICAS>
__device__ __forceinline__ void load_replicas(const float* row, float2 (&parts)[REPLICAS]) {
#pragma unroll
    for (int replica = 0; replica < REPLICAS; ++replica) parts[replica] = load_l2(row + replica * D + 2 * threadIdx.x);
}
template <int REPLICAS>
__device__ __forceinline__ float2 sum_replicas(const float2 (&parts)[REPLICAS]) {
    float2 total = parts[0];
#pragma unroll
    for (int replica = 1; replica < REPLICAS; ++replica) {
        total.x += parts[replica].x;
        total.y += parts[replica].y;
    }
    return total;
}

// ---- grid barrier: a counter in global memory ------------------------------------------------------

// Every thread's writes before, then thread 0's release add.
__device__ __forceinline__ void grid_arrive(unsigned* counter) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
}

// Thread 0 polls (acquire) until ``target`` arrivals, or gives up after SPIN_LIMIT polls and raises
// the error flag instead of hanging the GPU; once it gave up (``stuck``) it polls no more this step,
// so a grid that cannot be resident costs one time-out a step, not one a barrier. The other threads
// wait at the block barrier.
__device__ __forceinline__ void grid_wait(unsigned* counter, unsigned target, int* error, bool& stuck) {
    if (threadIdx.x == 0 && !stuck) {
        unsigned seen = 0;
        long long polls = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target && ++polls < SPIN_LIMIT);
        if (seen < target) {
            stuck = true;
            atomicMax(error, 1);
        }
    }
    __syncthreads();
}

// ---- the step's own timeline (TIMELINE 1): thread 0 of each CTA stamps the global timer ---------------

// Events of a layer, in order; stamps (layers, STAMPS, CTAS) int64 nanoseconds.
enum Stamp { ATTEND_RELEASED, INPUT_NORMED, QKV_DONE, GATHERED, PARTIAL_DONE, MERGED, OUT_ADDED,
             FFN_RELEASED, FFN_NORMED, HIDDEN_DONE, FFN_ADDED, STAMPS };

__device__ __forceinline__ void stamp(long long* timeline, int layer, int event, int cta) {
#if TIMELINE
    if (threadIdx.x == 0) {
        long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        timeline[(layer * STAMPS + event) * CTAS + cta] = now;
    }
#endif
}

// ---- the cluster -----------------------------------------------------------------------------------

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// A float in CTA ``rank``'s shared memory at the address ``local`` has in this CTA's.
__device__ __forceinline__ float load_remote(const float* local, unsigned rank) {
    unsigned remote;
    float value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_address(local)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(remote) : "memory");
    return value;
}

// ---- what each phase copies a phase ahead ------------------------------------------------------------

struct Weights {
    const half_t *qkv_w, *qkv_b, *out_w, *out_b, *ffn1_w, *ffn1_b, *ffn2_w, *ffn2_b;
    const half_t *norm1_w, *norm1_b, *norm2_w, *norm2_b, *predict_w, *embedding, *positions;
    // BULK_COPIES only (null otherwise): W_o as (layers, H, D, HD), each head's columns contiguous, and
    // W_2 transposed, (layers, FFN, D): a CTA's tile of either is then one contiguous run.
    const half_t *out_heads, *ffn2_t;
};

// The attend phase's tiles of ``layer``, with the first block of its chunk's cached keys and values.
__device__ __forceinline__ void copy_attend(char* smem, const Weights& w, int layer, int head, int rank,
                                            const half_t* cache_layer, int chunk_lo, int block_len) {
    for (int which = 0; which < 3; ++which)
        copy_rows(smem + SM_QKV_W + which * 2 * QKV_ROWS * D,
                  w.qkv_w + (static_cast<long long>(layer) * 3 + which) * D * D
                      + static_cast<long long>(head * HD + rank * QKV_ROWS) * D,
                  1, 2 * QKV_ROWS * D, 0);
    if (threadIdx.x < 3 * HD / 8) {  // the head's biases of q, k and v
        const int which = threadIdx.x / (HD / 8), run = threadIdx.x % (HD / 8);
        copy16(smem + SM_QKV_B + (which * HD + run * 8) * 2, w.qkv_b + layer * 3 * D + which * D + head * HD + run * 8);
    }
    copy_rows(smem + SM_OUT_W, w.out_w + static_cast<long long>(layer) * D * D
                                   + static_cast<long long>(rank * OUT_ROWS) * D + head * HD,
              OUT_ROWS, 2 * HD, 2LL * D);
    copy_rows(smem + SM_OUT_B, w.out_b + layer * D + rank * OUT_ROWS, 1, 2 * OUT_ROWS, 0);
    if (layer > 0) {
        copy_rows(smem + SM_NORM2, w.norm2_w + (layer - 1) * D, 1, 2 * D, 0);
        copy_rows(smem + SM_NORM2 + 2 * D, w.norm2_b + (layer - 1) * D, 1, 2 * D, 0);
    }
    if (block_len > 0) {
        const half_t* first = cache_layer + static_cast<long long>(chunk_lo) * 2 * D + head * HD;
        copy_rows(smem + SM_KV, first, block_len, 2 * HD, 4LL * D);
        copy_rows(smem + SM_KV + 2 * KV_BLOCK * HD, first + D, block_len, 2 * HD, 4LL * D);
    }
}

__device__ __forceinline__ void copy_ffn(char* smem, const Weights& w, int layer, int cta) {
    copy_rows(smem + SM_FFN1_W, w.ffn1_w + static_cast<long long>(layer) * FFN * D
                                    + static_cast<long long>(cta * UNITS) * D, 1, 2 * UNITS * D, 0);
    copy_rows(smem + SM_FFN2_W, w.ffn2_w + static_cast<long long>(layer) * D * FFN + cta * UNITS,
              D, 2 * UNITS, 2LL * FFN);
    copy_rows(smem + SM_FFN1_B, w.ffn1_b + layer * FFN + cta * UNITS, 1, 2 * UNITS, 0);
    copy_rows(smem + SM_FFN2_B, w.ffn2_b + layer * D, 1, 2 * D, 0);
    copy_rows(smem + SM_NORM1, w.norm1_w + layer * D, 1, 2 * D, 0);
    copy_rows(smem + SM_NORM1 + 2 * D, w.norm1_b + layer * D, 1, 2 * D, 0);
}

__device__ __forceinline__ int vocab_first(int cta) { return cta * VOCAB_BASE + min(cta, VOCAB_EXTRA); }
__device__ __forceinline__ int vocab_rows(int cta) { return VOCAB_BASE + (cta < VOCAB_EXTRA ? 1 : 0); }

__device__ __forceinline__ void copy_logits(char* smem, const Weights& w, int cta) {
    copy_rows(smem + SM_QKV_W, w.predict_w + static_cast<long long>(vocab_first(cta)) * D, 1,
              2 * vocab_rows(cta) * D, 0);
    copy_rows(smem + SM_NORM2, w.norm2_w + (LAYERS - 1) * D, 1, 2 * D, 0);
    copy_rows(smem + SM_NORM2 + 2 * D, w.norm2_b + (LAYERS - 1) * D, 1, 2 * D, 0);
}

// The next layer's attend tiles, or after the last layer the logits tile, as one copy group.
__device__ __forceinline__ void copy_next_attend(char* smem, const Weights& w, int layer, int head, int rank,
                                                 const half_t* cache, long long cache_layer_stride, int chunk_lo,
                                                 int first_block, int cta) {
    if (layer + 1 < LAYERS) {
        copy_attend(smem, w, layer + 1, head, rank, cache + (layer + 1) * cache_layer_stride, chunk_lo, first_block);
    } else {
        copy_logits(smem, w, cta);
    }
    copy_commit();
}

// ---- BULK_COPIES: the weight tiles through the tensor memory accelerator -------------------------------
// One warp issues each phase's weight tiles as bulk copies (one instruction a contiguous run, from the
// repacked W_o and W_2 of ``Weights``) that count their bytes into an mbarrier; the other warps start the
// phase's work at once and wait on the mbarrier where they first read a tile. The cached keys and values,
// 64-byte runs a position apart, stay cp.async copies: the accelerator takes each small run on its own
// (hundreds of 64-byte runs a phase, one bulk copy each, took ~12 us on an H100).

__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}
// Wait until the mbarrier's phase of this parity has completed (its copies have landed).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n\t}" :: "r"(smem_address(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk(void* shared, const void* global, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_address(shared)), "l"(global), "r"(bytes), "r"(smem_address(bar)) : "memory");
}
// Lane 0 orders the CTA's earlier reads of the buffers before the copies' writes (another proxy) and
// announces the bytes; then the lanes issue.
__device__ __forceinline__ void bulk_begin(unsigned long long* bar, unsigned bytes) {
    if ((threadIdx.x & 31) == 0) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_expect(bar, bytes);
    }
    __syncwarp();
}

__device__ __forceinline__ void bulk_attend_weights(char* smem, const Weights& w, int layer, int head, int rank,
                                                    unsigned long long* bar) {
    const int lane = threadIdx.x & 31;
    if (lane < 3) {
        bulk(smem + SM_QKV_W + lane * 2 * QKV_ROWS * D,
             w.qkv_w + (static_cast<long long>(layer) * 3 + lane) * D * D + static_cast<long long>(head * HD + rank * QKV_ROWS) * D,
             2 * QKV_ROWS * D, bar);
        bulk(smem + SM_QKV_B + lane * 2 * HD, w.qkv_b + layer * 3 * D + lane * D + head * HD, 2 * HD, bar);
    } else if (lane == 3) {
        bulk(smem + SM_OUT_B, w.out_b + layer * D + rank * OUT_ROWS, 2 * OUT_ROWS, bar);
    } else if (lane == 4 && layer > 0) {
        bulk(smem + SM_NORM2, w.norm2_w + (layer - 1) * D, 2 * D, bar);
        bulk(smem + SM_NORM2 + 2 * D, w.norm2_b + (layer - 1) * D, 2 * D, bar);
    } else if (lane == 5) {
        bulk(smem + SM_OUT_W, w.out_heads + (static_cast<long long>(layer) * H + head) * D * HD + rank * OUT_ROWS * HD,
             2 * OUT_ROWS * HD, bar);
    }
}

// The attend phase's weight tiles (one warp), then every thread's share of the cached keys and values
// (cp.async, one group).
__device__ __forceinline__ void bulk_attend(char* smem, const Weights& w, int layer, int head, int rank,
                                            const half_t* cache_layer, int chunk_lo, int block_len,
                                            unsigned long long* bar) {
    if (threadIdx.x / 32 == WARPS - 1) {
        bulk_begin(bar, 2 * (3 * QKV_ROWS * D + 3 * HD + OUT_ROWS * HD + OUT_ROWS + (layer > 0 ? 2 * D : 0)));
        bulk_attend_weights(smem, w, layer, head, rank, bar);
    }
    const half_t* first = cache_layer + static_cast<long long>(chunk_lo) * 2 * D + head * HD;
    copy_rows(smem + SM_KV, first, block_len, 2 * HD, 4LL * D);
    copy_rows(smem + SM_KV + 2 * KV_BLOCK * HD, first + D, block_len, 2 * HD, 4LL * D);
    copy_commit();
}

__device__ __forceinline__ void bulk_ffn(char* smem, const Weights& w, int layer, int cta, unsigned long long* bar) {
    bulk_begin(bar, 2 * (2 * UNITS * D + UNITS + 3 * D));
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        bulk(smem + SM_FFN1_W, w.ffn1_w + static_cast<long long>(layer) * FFN * D + static_cast<long long>(cta * UNITS) * D,
             2 * UNITS * D, bar);
    } else if (lane == 1) {
        bulk(smem + SM_FFN1_B, w.ffn1_b + layer * FFN + cta * UNITS, 2 * UNITS, bar);
        bulk(smem + SM_FFN2_B, w.ffn2_b + layer * D, 2 * D, bar);
    } else if (lane == 2) {
        bulk(smem + SM_NORM1, w.norm1_w + layer * D, 2 * D, bar);
        bulk(smem + SM_NORM1 + 2 * D, w.norm1_b + layer * D, 2 * D, bar);
    } else if (lane == 3) {  // (UNITS, D): the CTA's rows of W_2 transposed
        bulk(smem + SM_FFN2_W, w.ffn2_t + (static_cast<long long>(layer) * FFN + cta * UNITS) * D, 2 * UNITS * D, bar);
    }
}

__device__ __forceinline__ void bulk_logits(char* smem, const Weights& w, int cta, unsigned long long* bar) {
    bulk_begin(bar, 2 * (vocab_rows(cta) * D + 2 * D));
    if ((threadIdx.x & 31) == 0) {
        bulk(smem + SM_QKV_W, w.predict_w + static_cast<long long>(vocab_first(cta)) * D, 2 * vocab_rows(cta) * D, bar);
        bulk(smem + SM_NORM2, w.norm2_w + (LAYERS - 1) * D, 2 * D, bar);
        bulk(smem + SM_NORM2 + 2 * D, w.norm2_b + (LAYERS - 1) * D, 2 * D, bar);
    }
}

// ---- the step ------------------------------------------------------------------------------------

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, 1)
t2s_cluster_step(Weights w, half_t* cache, long long cache_layer_stride, const long long* last_token,
                 const long long* audio_pos, const long long* cache_len, float* sum1, float* sum2,
                 float* logits, unsigned* barrier, int* error, float scale, long long* timeline) {
    extern __shared__ __align__(16) char smem[];
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (dynamic_bytes < SHARED_BYTES) {  // the launch gave less than the layout needs: flag it, touch nothing
        if (threadIdx.x == 0) atomicMax(error, 2);
        return;
    }
    const int cta = blockIdx.x;
    const int head = cta / CLUSTER;
    const int rank = static_cast<int>(cluster_rank());
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    const half_t* qkv_w = reinterpret_cast<const half_t*>(smem + SM_QKV_W);
    const half_t* out_w = reinterpret_cast<const half_t*>(smem + SM_OUT_W);
    const half_t* keys = reinterpret_cast<const half_t*>(smem + SM_KV);
    const half_t* values = keys + KV_BLOCK * HD;
    const half_t* ffn1_w = reinterpret_cast<const half_t*>(smem + SM_FFN1_W);
    const half_t* ffn2_w = reinterpret_cast<const half_t*>(smem + SM_FFN2_W);
    const half_t* qkv_b = reinterpret_cast<const half_t*>(smem + SM_QKV_B);
    const half_t* out_b = reinterpret_cast<const half_t*>(smem + SM_OUT_B);
    const half_t* norm2 = reinterpret_cast<const half_t*>(smem + SM_NORM2);
    const half_t* ffn1_b = reinterpret_cast<const half_t*>(smem + SM_FFN1_B);
    const half_t* ffn2_b = reinterpret_cast<const half_t*>(smem + SM_FFN2_B);
    const half_t* norm1 = reinterpret_cast<const half_t*>(smem + SM_NORM1);
    float* x = reinterpret_cast<float*>(smem + SM_X);
    float* x1 = reinterpret_cast<float*>(smem + SM_X1);
    float* slice = reinterpret_cast<float*>(smem + SM_SLICE);
    float* gathered = reinterpret_cast<float*>(smem + SM_GATHERED);
    float* partial = reinterpret_cast<float*>(smem + SM_PARTIAL);
    float* attention = reinterpret_cast<float*>(smem + SM_ATTN);
    float* scores = reinterpret_cast<float*>(smem + SM_SCORES);
    float* acc_parts = reinterpret_cast<float*>(smem + SM_ACC);
    float* hidden = reinterpret_cast<float*>(smem + SM_HIDDEN);
    float* scratch = reinterpret_cast<float*>(smem + SM_RED);

    const int write_pos = static_cast<int>(min(*cache_len, static_cast<long long>(MAX_LEN - 1)));
    const int token = static_cast<int>(*last_token);
    const int position = static_cast<int>(min(*audio_pos, static_cast<long long>(MAX_POSITION - 1)));
    // The cached positions 0..write_pos-1 split evenly over the head's CTAs; the last CTA also takes
    // the new position, whose k and v it has from the gather.
    const int span = (write_pos + CLUSTER - 1) / CLUSTER;
    const int chunk_lo = min(rank * span, write_pos);
    const int chunk_hi = min(chunk_lo + span, write_pos);
    const int first_block = min(chunk_hi - chunk_lo, KV_BLOCK);
    unsigned barriers = 0;
    bool stuck = false;

#if BULK_COPIES
    unsigned long long* mbars = reinterpret_cast<unsigned long long*>(smem + SM_MBAR);  // attend, ffn
    if (threadIdx.x == 0) {
        mbar_init(&mbars[0]);
        mbar_init(&mbars[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    bulk_attend(smem, w, 0, head, rank, cache, chunk_lo, first_block, &mbars[0]);
#else
    copy_attend(smem, w, 0, head, rank, cache, chunk_lo, first_block);
    copy_commit();
#endif

    for (int layer = 0; layer < LAYERS; ++layer) {
        half_t* cache_layer = cache + layer * cache_layer_stride;
        // ---------------- attend ----------------
        // The FFN tiles of this layer are copied a phase ahead: before this barrier, or (COPY_AFTER_RELEASE)
        // once it released and the layer input's loads are issued, so no copy queues ahead of the poll.
#if !COPY_AFTER_RELEASE && !BULK_COPIES
        copy_ffn(smem, w, layer, cta);
        copy_commit();
        copy_wait<1>();  // this layer's attend tiles
#endif
        if (layer > 0) grid_wait(barrier, ++barriers * CTAS, error, stuck);
        else __syncthreads();
        stamp(timeline, layer, ATTEND_RELEASED, cta);
        float2 sum2_parts[REPLICAS_2];
        if (layer > 0) load_replicas(sum2 + (layer - 1) * REPLICAS_2 * D, sum2_parts);
#if BULK_COPIES
        if (warp == WARPS - 1) bulk_ffn(smem, w, layer, cta, &mbars[1]);
        mbar_wait(&mbars[0], layer & 1);  // this layer's attend tiles
        copy_wait<0>();  // and its cached keys and values (published by the barrier after the norm)
#elif COPY_AFTER_RELEASE
        copy_ffn(smem, w, layer, cta);
        copy_commit();
        copy_wait<1>();  // this layer's attend tiles
        __syncthreads();
#endif
        if (layer == 0) {
            const int dim = 2 * threadIdx.x;
            x[dim] = h2f(w.embedding[token * D + dim]) + h2f(w.positions[position * D + dim]);
            x[dim + 1] = h2f(w.embedding[token * D + dim + 1]) + h2f(w.positions[position * D + dim + 1]);
        } else {
            layer_norm(sum_replicas(sum2_parts), norm2, norm2 + D, x, scratch);
        }
        __syncthreads();
        stamp(timeline, layer, INPUT_NORMED, cta);
        {  // this CTA's rows of q, k and v: warp w takes rows w, w + WARPS, ...
            float xs[D / 32];
            lane_slice(x, xs);
#pragma unroll
            for (int pass = 0; pass < (3 * QKV_ROWS + WARPS - 1) / WARPS; ++pass) {
                const int row = warp + pass * WARPS;
                if (row >= 3 * QKV_ROWS) break;
                const float value = row_dot(qkv_w + row * D, xs)
                                    + h2f(qkv_b[(row / QKV_ROWS) * HD + rank * QKV_ROWS + row % QKV_ROWS]);
                if (lane == 0) {
                    const int which = row / QKV_ROWS, index = row % QKV_ROWS;
                    if (which == 0) {
                        slice[row] = value * scale;
                    } else {  // k and v are rounded to the cache's FP16, as later steps will read them
                        const half_t rounded = f2h(value);
                        slice[row] = h2f(rounded);
                        cache_layer[static_cast<long long>(write_pos) * 2 * D + (which - 1) * D + head * HD
                                    + rank * QKV_ROWS + index] = rounded;
                    }
                }
            }
        }
        stamp(timeline, layer, QKV_DONE, cta);
        cluster_sync();
        if (threadIdx.x < 3 * HD) {  // the head's q, k_new, v_new from its CTAs' slices
            const int which = threadIdx.x / HD, j = threadIdx.x % HD;
            gathered[threadIdx.x] = load_remote(slice + which * QKV_ROWS + j % QKV_ROWS, j / QKV_ROWS);
        }
        __syncthreads();
        stamp(timeline, layer, GATHERED, cta);
        {  // the softmax partial of the chunk (and, in the last CTA, of the new position): a thread a position
            float q[HD];
#pragma unroll
            for (int i = 0; i < HD; ++i) q[i] = gathered[i];
            const int j = threadIdx.x % HD, group = threadIdx.x / HD;  // THREADS / HD groups of HD threads
            const bool takes_new = rank == CLUSTER - 1;
            float best = NEG_INF, total = 0.f, acc = 0.f;
            int block_lo = chunk_lo;
            int block_len = first_block;
            for (;;) {
                const bool last_block = block_lo + block_len >= chunk_hi;
                const int count = block_len + (last_block && takes_new ? 1 : 0);
                float own_best = NEG_INF;
                for (int p = threadIdx.x; p < count; p += THREADS) {
                    float score = 0.f;
                    if (p < block_len) {
                        const uint4* runs = reinterpret_cast<const uint4*>(keys + p * HD);
#pragma unroll
                        for (int run = 0; run < HD / 8; ++run) score += dot8(runs[run], q + run * 8);
                    } else {
#pragma unroll
                        for (int i = 0; i < HD; ++i) score = fmaf(gathered[HD + i], q[i], score);
                    }
                    scores[p] = score;
                    own_best = fmaxf(own_best, score);
                }
                const float new_best = fmaxf(best, block_max(own_best, scratch));
                // An empty chunk keeps best = -inf and weighs nothing in the merge.
                const float rescale = new_best == NEG_INF ? 0.f : __expf(best - new_best);
                float own_total = 0.f;
                for (int p = threadIdx.x; p < count; p += THREADS) {
                    const float weight = __expf(scores[p] - new_best);
                    scores[p] = weight;
                    own_total += weight;
                }
                total = total * rescale + block_sum(own_total, scratch + WARPS);  // its barrier publishes the weights
                float block_acc = 0.f;
#pragma unroll 4
                for (int p = group; p < count; p += THREADS / HD) {
                    const float value = p < block_len ? h2f(values[p * HD + j]) : gathered[2 * HD + j];
                    block_acc = fmaf(scores[p], value, block_acc);
                }
                acc = acc * rescale + block_acc;
                best = new_best;
                if (last_block) break;
                block_lo += block_len;
                block_len = min(chunk_hi - block_lo, KV_BLOCK);
                __syncthreads();  // every thread done with the block and its weights
                const half_t* next = cache_layer + static_cast<long long>(block_lo) * 2 * D + head * HD;
                copy_rows(smem + SM_KV, next, block_len, 2 * HD, 4LL * D);
                copy_rows(smem + SM_KV + 2 * KV_BLOCK * HD, next + D, block_len, 2 * HD, 4LL * D);
                copy_commit();
                copy_wait<0>();
                __syncthreads();
            }
            acc_parts[group * HD + j] = acc;
            __syncthreads();
            if (threadIdx.x < HD) {
                float summed = 0.f;
#pragma unroll
                for (int g = 0; g < THREADS / HD; ++g) summed += acc_parts[g * HD + threadIdx.x];
                partial[4 + threadIdx.x] = summed;
            }
            if (threadIdx.x == 0) {
                partial[0] = best;
                partial[1] = total;
            }
        }
        stamp(timeline, layer, PARTIAL_DONE, cta);
        cluster_sync();
        if (threadIdx.x < HD) {  // merge the head's partials: its attention output
            float maxima[CLUSTER];
            float head_best = NEG_INF;
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) {
                maxima[r] = load_remote(partial, r);
                head_best = fmaxf(head_best, maxima[r]);
            }
            float numerator = 0.f, denominator = 0.f;
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) {
                const float factor = maxima[r] == NEG_INF ? 0.f : __expf(maxima[r] - head_best);
                numerator = fmaf(load_remote(partial + 4 + threadIdx.x, r), factor, numerator);
                denominator = fmaf(load_remote(partial + 1, r), factor, denominator);
            }
            attention[threadIdx.x] = numerator / denominator;
        }
        __syncthreads();
        stamp(timeline, layer, MERGED, cta);
        {  // this CTA's OUT_ROWS rows of W_o[:, head] . attention, OUT_THREADS threads a row
            constexpr int SPAN = HD / OUT_THREADS;
            const int row = threadIdx.x / OUT_THREADS, part = threadIdx.x % OUT_THREADS;
            const uint4* runs = reinterpret_cast<const uint4*>(out_w + row * HD + part * SPAN);
            float value = 0.f;
#pragma unroll
            for (int run = 0; run < SPAN / 8; ++run) value += dot8(runs[run], attention + part * SPAN + run * 8);
#pragma unroll
            for (int offset = 1; offset < OUT_THREADS; offset <<= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
            if (part == 0) {
                const int n = rank * OUT_ROWS + row;
                if (head == 0) value += h2f(out_b[row]) + x[n];
                atomicAdd(sum1 + (layer * REPLICAS_1 + head % REPLICAS_1) * D + n, value);
            }
        }
        stamp(timeline, layer, OUT_ADDED, cta);
        grid_arrive(barrier);

        // ---------------- ffn ----------------
#if !COPY_AFTER_RELEASE && !BULK_COPIES
        copy_next_attend(smem, w, layer, head, rank, cache, cache_layer_stride, chunk_lo, first_block, cta);
        copy_wait<1>();  // this layer's FFN tiles
#endif
        grid_wait(barrier, ++barriers * CTAS, error, stuck);
        stamp(timeline, layer, FFN_RELEASED, cta);
        float2 sum1_parts[REPLICAS_1];
        load_replicas(sum1 + layer * REPLICAS_1 * D, sum1_parts);
#if BULK_COPIES
        if (layer + 1 < LAYERS) {
            bulk_attend(smem, w, layer + 1, head, rank, cache + (layer + 1) * cache_layer_stride, chunk_lo,
                        first_block, &mbars[0]);
        } else if (warp == WARPS - 1) {
            bulk_logits(smem, w, cta, &mbars[0]);
        }
        mbar_wait(&mbars[1], layer & 1);  // this layer's FFN tiles
#elif COPY_AFTER_RELEASE
        copy_next_attend(smem, w, layer, head, rank, cache, cache_layer_stride, chunk_lo, first_block, cta);
        copy_wait<1>();  // this layer's FFN tiles
        __syncthreads();
#endif
        layer_norm(sum_replicas(sum1_parts), norm1, norm1 + D, x1, scratch);
        __syncthreads();
        stamp(timeline, layer, FFN_NORMED, cta);
        {
            float xs[D / 32];
            lane_slice(x1, xs);
#pragma unroll
            for (int pass = 0; pass < UNITS / WARPS; ++pass) {
                const int unit = warp + pass * WARPS;
                const float value = row_dot(ffn1_w + unit * D, xs) + h2f(ffn1_b[unit]);
                if (lane == 0) hidden[unit] = fmaxf(value, 0.f);
            }
        }
        __syncthreads();
        stamp(timeline, layer, HIDDEN_DONE, cta);
#if BULK_COPIES
        {  // the partial of sum 2 from W_2 transposed (UNITS, D): dims 2t and 2t + 1
            const int n = 2 * threadIdx.x;
            float even = 0.f, odd = 0.f;
#pragma unroll
            for (int unit = 0; unit < UNITS; ++unit) {
                const unsigned packed = *reinterpret_cast<const unsigned*>(ffn2_w + unit * D + n);
                even = fmaf(h2f(static_cast<half_t>(packed & 0xffff)), hidden[unit], even);
                odd = fmaf(h2f(static_cast<half_t>(packed >> 16)), hidden[unit], odd);
            }
            if (cta == 0) {
                even += h2f(ffn2_b[n]) + x1[n];
                odd += h2f(ffn2_b[n + 1]) + x1[n + 1];
            }
            float* row = sum2 + (layer * REPLICAS_2 + cta % REPLICAS_2) * D;
            atomicAdd(row + n, even);
            atomicAdd(row + n + 1, odd);
        }
#else
        for (int n = threadIdx.x; n < D; n += THREADS) {  // the partial of sum 2: W_2[n, units] . hidden
            const uint4* runs = reinterpret_cast<const uint4*>(ffn2_w + n * UNITS);
            float value = 0.f;
#pragma unroll
            for (int run = 0; run < UNITS / 8; ++run) value += dot8(runs[run], hidden + run * 8);
            if (cta == 0) value += h2f(ffn2_b[n]) + x1[n];
            atomicAdd(sum2 + (layer * REPLICAS_2 + cta % REPLICAS_2) * D + n, value);
        }
#endif
        stamp(timeline, layer, FFN_ADDED, cta);
        grid_arrive(barrier);
    }

    // ---------------- logits ----------------
    copy_wait<0>();
    grid_wait(barrier, ++barriers * CTAS, error, stuck);
#if BULK_COPIES
    mbar_wait(&mbars[0], LAYERS & 1);  // the logits tile
#endif
    float2 last_parts[REPLICAS_2];
    load_replicas(sum2 + (LAYERS - 1) * REPLICAS_2 * D, last_parts);
    layer_norm(sum_replicas(last_parts), norm2, norm2 + D, x, scratch);
    __syncthreads();
    {
        float xs[D / 32];
        lane_slice(x, xs);
        const int first = vocab_first(cta), rows = vocab_rows(cta);
        for (int row = warp; row < rows; row += WARPS) {
            const float value = row_dot(qkv_w + row * D, xs);
            if (lane == 0) logits[first + row] = value;
        }
    }
    cluster_sync();  // no CTA leaves while another could still read its shared memory
}
