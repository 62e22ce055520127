// CPU kernels for XLA's FFI (custom calls), built by jaxagent/kernels/cpu.py on first use.
//
// rows_matmul: y[b, t] = x[b, t] w for each row's first n_valid[b] tokens (0 elsewhere), with w
//   pre-arranged by pack_panels into panels of kNr columns ([N / kNr][K][kNr], contiguous). XLA:CPU's
//   Eigen GEMM packs the whole weight matrix on every call; at 16 rows that ran at ~5 GB/s of weights
//   (memory streams ~14-16 GB/s on two cores here). Few rows (decoding): each panel is read once from
//   memory, reused from L1 for every tile of kMr rows while the next panel is prefetched. Many rows
//   (appends): chunks of rows, each panel reused by all the chunk's tiles; padding rows cost nothing.
// mlp: the SwiGLU block for many rows in one call, its [rows, 2F] intermediate kept in L2.
// norm_rope: the q and k heads' RMS norms and rotary embedding, one pass over the [q | k | v] product.
// attention: softmax(q k^T / sqrt(E) + mask) v over a KV cache (keys [B, K, E, S], values [B, K, S, E]),
//   per (batch row, KV head), 48 query rows at a time: register-tiled scores with the mask and row max
//   fused in, exp2, and the value product, each group of rows stopping at its last unmasked slot; the
//   window and each row's number of real queries are read at run time.
// pack_panels: the panel layout of one or several weight matrices placed side by side.
// Every kernel splits its work over XLA's intra-op thread pool (parallel_chunks).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8f __attribute__((vector_size(32)));
constexpr int kNr = 16;  // columns per strip: two 8-lane vectors (one 64-byte line of w per row)
constexpr int kMr = 6;   // rows per register tile: 12 accumulators + 2 weights + 1 broadcast <= 16 regs

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

// Runs body(c) for c in [0, chunks) on the caller and up to threads - 1 pool workers. Chunks are
// claimed from a shared counter, so the caller never waits on a task that has not started: it runs
// every unclaimed chunk itself (no deadlock when the pool is busy), then waits for claimed ones.
template <typename Body>
void parallel_chunks(ffi::ThreadPool& pool, int64_t chunks, Body body) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<State>();
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    pool.Schedule([state, chunks, body]() {
      for (int64_t c; (c = state->next.fetch_add(1)) < chunks;) {
        body(c);
        state->done.fetch_add(1, std::memory_order_release);
      }
    });
  }
  for (int64_t c; (c = state->next.fetch_add(1)) < chunks;) {
    body(c);
    state->done.fetch_add(1, std::memory_order_release);
  }
  while (state->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}

// ------------------------------------------------------------------------------ matmul of valid rows
// y[b, t] = x[b, t] w for t < n_valid[b], 0 for the other rows: a batch of right-padded sequences
// (appends of different lengths, finished episodes with n_valid 0) costs only its real tokens. The
// valid rows are gathered by pointer into tiles of kMr rows; the work is split into chunks of
// kChunkRows rows (for many rows; each panel is then reused from L1 by all the chunk's tiles) or
// additionally into groups of panels (for few rows: the weights then stream from memory once).

// Rows xr[0..R) x panel columns [j0, j0 + kNr): y = x w. The first step initialises the accumulators.
// With kPrefetch (few rows: the weights stream from memory) the next panel is fetched meanwhile.
template <int R, bool kPrefetch>
inline void tile_rows(const float* const* xr, const float* w, float* const* yr, int64_t K, int64_t j0) {
  const float* wk = w + j0 * K;  // panel j0 / kNr: [K, kNr], contiguous
  if (kPrefetch) __builtin_prefetch(wk + kNr * K);
  v8f w0 = load8(wk), w1 = load8(wk + 8);
  v8f acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = xr[r][0] * w0;
    acc1[r] = xr[r][0] * w1;
  }
  wk += kNr;
  for (int64_t k = 1; k < K; ++k, wk += kNr) {
    if (kPrefetch) __builtin_prefetch(wk + kNr * K);
    w0 = load8(wk);
    w1 = load8(wk + 8);
    for (int r = 0; r < R; ++r) {
      const float a = xr[r][k];
      acc0[r] += a * w0;
      acc1[r] += a * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    store8(yr[r] + j0, acc0[r]);
    store8(yr[r] + j0 + 8, acc1[r]);
  }
}

// Rows xr[0..m) by panel columns [j0, min(j0 + kNr, N)).
template <bool kPrefetch>
void strip_rows(const float* const* xr, const float* w, float* const* yr, int64_t m, int64_t K, int64_t N,
                int64_t j0) {
  if (j0 + kNr > N) {  // the last, partial panel: [K, N - j0], plain loops
    const int64_t nc = N - j0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nc; ++j) {
        float s = 0.f;
        for (int64_t k = 0; k < K; ++k) s += xr[i][k] * w[j0 * K + k * nc + j];
        yr[i][j0 + j] = s;
      }
    return;
  }
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) tile_rows<kMr, kPrefetch>(xr + i, w, yr + i, K, j0);
  switch (m - i) {
    case 5: tile_rows<5, kPrefetch>(xr + i, w, yr + i, K, j0); break;
    case 4: tile_rows<4, kPrefetch>(xr + i, w, yr + i, K, j0); break;
    case 3: tile_rows<3, kPrefetch>(xr + i, w, yr + i, K, j0); break;
    case 2: tile_rows<2, kPrefetch>(xr + i, w, yr + i, K, j0); break;
    case 1: tile_rows<1, kPrefetch>(xr + i, w, yr + i, K, j0); break;
    default: break;
  }
}

// Pointers to the rows (b, t < n_valid[b]) of x [B, T, K] and y [B, T, N] (n_valid clipped to [0, T]);
// y's other rows are set to 0.
void valid_rows(const float* x, float* y, const int32_t* n_valid, int64_t B, int64_t T, int64_t K, int64_t N,
                std::vector<const float*>& xr, std::vector<float*>& yr) {
  xr.reserve(B * T);
  yr.reserve(B * T);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::clamp<int64_t>(n_valid[b], 0, T);
    for (int64_t t = 0; t < n; ++t) {
      xr.push_back(x + (b * T + t) * K);
      yr.push_back(y + (b * T + t) * N);
    }
    if (n < T) std::memset(y + (b * T + n) * N, 0, sizeof(float) * (T - n) * N);
  }
}

constexpr int64_t kChunkRows = 16 * kMr;

ffi::Error RowsMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> n_valid,
                          ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), nd = n_valid.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 3 || nd.size() != 1 || wd.size() != 1 || yd.size() != 3 || nd[0] != xd[0] ||
      yd[0] != xd[0] || yd[1] != xd[1] || wd[0] != xd[2] * yd[2])
    return ffi::Error::InvalidArgument("rows_matmul: expects x[B, T, K], n_valid[B], packed w[K * N], y[B, T, N]");
  const int64_t B = xd[0], T = xd[1], K = xd[2], N = yd[2];
  const float* xp = x.typed_data();
  const int32_t* np_ = n_valid.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  std::vector<const float*> xr;
  std::vector<float*> yr;
  valid_rows(xp, yp, np_, B, T, K, N, xr, yr);
  const int64_t m = static_cast<int64_t>(xr.size());
  if (m == 0 || N == 0) return ffi::Error::Success();
  const int64_t strips = (N + kNr - 1) / kNr, threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t row_chunks = (m + kChunkRows - 1) / kChunkRows;
  // Enough tasks to balance the threads: split the panels too when there are few row chunks.
  const int64_t panel_groups = std::min(strips, std::max<int64_t>(1, (4 * threads + row_chunks - 1) / row_chunks));
  const int64_t per_group = (strips + panel_groups - 1) / panel_groups;
  const float* const* xrp = xr.data();
  float* const* yrp = yr.data();
  parallel_chunks(pool, row_chunks * panel_groups, [=](int64_t c) {
    const int64_t rc = c / panel_groups, pg = c % panel_groups;
    const int64_t r0 = rc * kChunkRows, nr = std::min(kChunkRows, m - r0);
    const int64_t s_end = std::min(strips, (pg + 1) * per_group);
    for (int64_t s = pg * per_group; s < s_end; ++s) {
      if (row_chunks == 1) strip_rows<true>(xrp + r0, wp, yrp + r0, nr, K, N, s * kNr);
      else strip_rows<false>(xrp + r0, wp, yrp + r0, nr, K, N, s * kNr);
    }
  });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------------- attention
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int8_t v8c __attribute__((vector_size(8)));

inline v8f splat(float a) { return v8f{a, a, a, a, a, a, a, a}; }

// 8 mask bytes -> lanes of all ones where nonzero. GCC 12 widens an 8-byte vector lane by lane in
// general-purpose registers (~30 instructions); AVX2 has one instruction for it.
inline v8i mask8(const bool* p) {
#ifdef __AVX2__
  const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return reinterpret_cast<v8i>(_mm256_cmpgt_epi32(wide, _mm256_setzero_si256()));
#else
  v8c m;
  std::memcpy(&m, p, sizeof m);
  return __builtin_convertvector(m, v8i) != 0;
#endif
}

// 2^x on 8 lanes for x <= 0 (a score minus its row max, in log2 units): x = n + f with n = round(x),
// |f| <= 1/2; 2^f by a degree-5 polynomial fitted for relative error (< 2.4e-7 in f32 arithmetic),
// times 2^n written into the exponent bits. x < -126 (every masked slot) gives exactly 0, as XLA's
// exp does for the softmax's masked slots; the lanes' other results are then never used.
inline v8f exp2_8(v8f x) {
  const v8i tiny = x < splat(-126.0f);
  const v8f round = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const v8f n = (x + round) - round;
  const v8f f = x - n;
  v8f p = splat(1.3276469e-3f);
  p = p * f + splat(9.6755410e-3f);
  p = p * f + splat(5.5507135e-2f);
  p = p * f + splat(2.4022120e-1f);
  p = p * f + splat(6.9314694e-1f);
  p = p * f + splat(1.0000001f);
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return tiny ? splat(0.0f) : p * scale;
}

struct AttnShape {
  int64_t B, T, H, KV, G, E, S, W;
};

constexpr float kMasked = -1e30f;   // the XLA path's finite mask value (here in log2 units)
constexpr float kBeyond = -3e38f;   // slots past a group's end: 0 even for a row with every slot masked

// Scores of rows [0, R) (pointers to their q vectors, already scaled by log2(e) / sqrt(E)) against slots
// [s0, s0 + kNr): sc = q . k where the row's mask is set, kMasked where not, kBeyond from `limit` on;
// vmax[r] keeps each row's running maximum (one pass over the scores fewer).
template <int R>
inline void score_tile(const float* const* q, const float* kt, int64_t E, int64_t S, int64_t s0, float* sc,
                       int64_t ld, const bool* const* m, int64_t limit, v8f* vmax) {
  const float* kp = kt + s0;
  // The first step initialises the accumulators (zero-filled arrays became a memset and stack spills).
  __builtin_prefetch(kp + 2 * kNr);
  v8f k0 = load8(kp), k1 = load8(kp + 8);
  v8f acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    const float a = q[r][0];
    acc0[r] = a * k0;
    acc1[r] = a * k1;
  }
  kp += S;
  for (int64_t e = 1; e < E; ++e, kp += S) {
    // The strip walks E rows of keys S apart: fetch each row's next line (the next strip) ahead, as the
    // hardware prefetchers do not follow that many strided streams.
    __builtin_prefetch(kp + 2 * kNr);
    k0 = load8(kp);
    k1 = load8(kp + 8);
    for (int r = 0; r < R; ++r) {
      const float a = q[r][e];
      acc0[r] += a * k0;
      acc1[r] += a * k1;
    }
  }
  const v8i slot = v8i{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<int32_t>(s0);
  const v8i in0 = slot < static_cast<int32_t>(limit), in1 = slot + 8 < static_cast<int32_t>(limit);
  for (int r = 0; r < R; ++r) {
    const v8f x0 = in0 ? (mask8(m[r] + s0) ? acc0[r] : splat(kMasked)) : splat(kBeyond);
    const v8f x1 = in1 ? (mask8(m[r] + s0 + 8) ? acc1[r] : splat(kMasked)) : splat(kBeyond);
    store8(sc + r * ld + s0, x0);
    store8(sc + r * ld + s0 + 8, x1);
    const v8f hi = x0 > x1 ? x0 : x1;
    vmax[r] = vmax[r] > hi ? vmax[r] : hi;
  }
}

// out rows[0..R) (8 * C columns from e0) (+)= sum_{s < n} p[r, s] v[s, e0 : e0 + 8 C]; accumulates into
// out when `acc_in` (the second and later slot chunks).
template <int R, int C>
inline void pv_tile(const float* p, int64_t ld, const float* v, int64_t E, int64_t n, int64_t e0,
                    float* const* out, bool acc_in) {
  v8f acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = acc_in ? load8(out[r] + e0 + 8 * c) : v8f{};
  const float* vp = v + e0;
  for (int64_t s = 0; s < n; ++s, vp += E) {
    v8f vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load8(vp + 8 * c);
    for (int r = 0; r < R; ++r) {
      const float a = p[r * ld + s];
      for (int c = 0; c < C; ++c) acc[r][c] += a * vv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store8(out[r] + e0 + 8 * c, acc[r][c]);
}

// Tiles of R rows x 16 columns for R >= 3 (for R = 6: 12 accumulators, 2 value vectors and one
// broadcast in registers, 8 loads per 12 FMAs; 3 rows x 32 columns needs 15 loads per 12 FMAs, as the
// value vectors no longer fit in registers, and ran at ~75% of the FMA rate). For one or two rows
// (decoding) 32 columns: each value row is then read whole and in order, which streams from memory
// better than two passes over half rows.
template <int R>
void pv_rows(const float* p, int64_t ld, const float* v, int64_t E, int64_t n, float* const* out, bool acc_in) {
  int64_t e0 = 0;
  if (R <= 2) {
    for (; e0 + 32 <= E; e0 += 32) pv_tile<R, 4>(p, ld, v, E, n, e0, out, acc_in);
    switch ((E - e0) / 8) {
      case 3: pv_tile<R, 3>(p, ld, v, E, n, e0, out, acc_in); break;
      case 2: pv_tile<R, 2>(p, ld, v, E, n, e0, out, acc_in); break;
      case 1: pv_tile<R, 1>(p, ld, v, E, n, e0, out, acc_in); break;
      default: break;
    }
    return;
  }
  for (; e0 + 16 <= E; e0 += 16) pv_tile<R, 2>(p, ld, v, E, n, e0, out, acc_in);
  if (e0 < E) pv_tile<R, 1>(p, ld, v, E, n, e0, out, acc_in);
}

inline void score_group(int rows, const float* const* q, const float* kt, int64_t E, int64_t S, int64_t s0,
                        float* sc, int64_t ld, const bool* const* m, int64_t limit, v8f* vmax) {
  switch (rows) {
    case 6: score_tile<6>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
    case 5: score_tile<5>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
    case 4: score_tile<4>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
    case 3: score_tile<3>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
    case 2: score_tile<2>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
    default: score_tile<1>(q, kt, E, S, s0, sc, ld, m, limit, vmax); break;
  }
}

// The last slot + 1 of row `m` below `w` that is unmasked; 0 if none. Eight mask bytes at a time.
inline int64_t unmasked_end(const bool* m, int64_t w) {
  int64_t s = w;
  for (; s % 8 != 0; --s)
    if (m[s - 1]) return s;
  for (; s > 0; s -= 8) {
    uint64_t word;
    std::memcpy(&word, m + s - 8, sizeof word);
    if (word != 0) return s - 8 + (63 - __builtin_clzll(word)) / 8 + 1;  // little endian: last byte highest
  }
  return 0;
}

constexpr int kRows = 6;     // query rows per group: the score tile's rows (12 accumulators)
constexpr int kGroups = 8;   // groups per block: each key strip / value chunk is loaded once for all of them
constexpr int kBlockRows = kRows * kGroups;
constexpr int64_t kValueChunkBytes = 16 << 10;  // value rows per chunk: stays in L1 while every group uses it

// One (batch row b, KV head h) pair: every query row (g, t) of its G heads, in blocks of up to kBlockRows
// rows. Per block, the scores of all rows are computed strip by strip (each strip of keys is read from
// L2 once and reused from L1 by every group), then each row's softmax, then the value product chunk by
// chunk (each chunk of values read once for every group). `work` holds kBlockRows * (ld + E) floats.
void attend_pair(const AttnShape& d, const float* q, const float* kt, const float* v, const bool* mask,
                 float* out, float qscale, int64_t b, int64_t h, int64_t n_valid, float* work) {
  // Only the row's first n_valid queries (a right-padded append): the others' outputs are 0.
  for (int64_t t = n_valid; t < d.T; ++t)
    std::memset(out + ((b * d.T + t) * d.H + h * d.G) * d.E, 0, sizeof(float) * d.G * d.E);
  const int64_t rows = d.G * n_valid, ld = (d.W + kNr - 1) / kNr * kNr;
  const float* ktp = kt + (b * d.KV + h) * d.E * d.S;  // [E, S]
  const float* vp = v + (b * d.KV + h) * d.S * d.E;    // [S, E]
  const int64_t chunk = std::max<int64_t>(kNr, kValueChunkBytes / (d.E * 4));
  float* sc = work;                    // [kBlockRows, ld] scores, then probabilities (unnormalised)
  float* qs = work + kBlockRows * ld;  // [kBlockRows, E] scaled queries
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t nr = std::min<int64_t>(kBlockRows, rows - r0);
    const int ng = static_cast<int>((nr + kRows - 1) / kRows);
    const float* qr[kBlockRows];
    float* orow[kBlockRows];
    const bool* mrow[kBlockRows];
    v8f vmax[kBlockRows];
    int64_t wg[kGroups];  // each group's slots: up to its rows' last unmasked one
    int rg[kGroups];      // rows in each group
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t g = (r0 + r) / n_valid, t = (r0 + r) % n_valid;
      const int64_t off = ((b * d.T + t) * d.H + h * d.G + g) * d.E;
      for (int64_t e = 0; e < d.E; e += 8) store8(qs + r * d.E + e, load8(q + off + e) * splat(qscale));
      qr[r] = qs + r * d.E;
      orow[r] = out + off;
      mrow[r] = mask + (b * d.T + t) * d.S;
      vmax[r] = splat(kMasked);
    }
    int64_t w_max = 0;
    for (int gi = 0; gi < ng; ++gi) {
      rg[gi] = static_cast<int>(std::min<int64_t>(kRows, nr - gi * kRows));
      // Slots past every row's last unmasked one only add 2^(-1e30 - max) = 0: stop the group there.
      // A row with no unmasked slot keeps the whole window (its softmax is uniform over all of it).
      int64_t w = 0;
      for (int r = gi * kRows; r < gi * kRows + rg[gi] && w < d.W; ++r) {
        const int64_t end = unmasked_end(mrow[r], d.W);
        w = end == 0 ? d.W : std::max(w, end);
      }
      wg[gi] = w;
      w_max = std::max(w_max, w);
    }
    // Whole strips up to each group's end rounded up, as far as the cache has slots (slots past the
    // group's end come out masked); the scalar loop below only runs when S is not a multiple of kNr.
    const int64_t w_tiles = std::min((w_max + kNr - 1) / kNr * kNr, d.S / kNr * kNr);
    for (int64_t s0 = 0; s0 + kNr <= w_tiles; s0 += kNr)
      for (int gi = 0; gi < ng; ++gi)
        if (s0 < wg[gi])
          score_group(rg[gi], qr + gi * kRows, ktp, d.E, d.S, s0, sc + gi * kRows * ld, ld, mrow + gi * kRows,
                      wg[gi], vmax + gi * kRows);
    float inv_sum[kBlockRows];
    for (int gi = 0; gi < ng; ++gi) {
      const int64_t W = wg[gi], tiled = std::min((W + kNr - 1) / kNr * kNr, w_tiles);
      for (int r = gi * kRows; r < gi * kRows + rg[gi]; ++r) {
        float* row = sc + r * ld;
        float mx = vmax[r][0];
        for (int l = 1; l < 8; ++l) mx = std::max(mx, vmax[r][l]);
        for (int64_t s = tiled; s < W; ++s) {  // the last, partial strip
          float a = 0.f;
          for (int64_t e = 0; e < d.E; ++e) a += qr[r][e] * ktp[e * d.S + s];
          row[s] = mrow[r][s] ? a : kMasked;
          mx = std::max(mx, row[s]);
        }
        // 2^(score - row max) in place; whole vectors as far as the tiles wrote (masked beyond W)
        const int64_t vec_end = tiled >= (W + 7) / 8 * 8 ? (W + 7) / 8 * 8 : W / 8 * 8;
        v8f total = v8f{};
        int64_t s = 0;
        for (; s < vec_end; s += 8) {
          const v8f e = exp2_8(load8(row + s) - splat(mx));
          store8(row + s, e);
          total += e;
        }
        float sum = 0.f;
        for (int l = 0; l < 8; ++l) sum += total[l];
        for (; s < W; ++s) sum += (row[s] = exp2_8(splat(row[s] - mx))[0]);
        inv_sum[r] = 1.0f / sum;
      }
    }
    for (int64_t c0 = 0; c0 < w_max; c0 += chunk)
      for (int gi = 0; gi < ng; ++gi) {
        if (c0 >= wg[gi]) continue;
        const int64_t n = std::min(chunk, wg[gi] - c0);
        const float* p = sc + gi * kRows * ld + c0;
        const float* vc = vp + c0 * d.E;
        float* const* o = orow + gi * kRows;
        switch (rg[gi]) {
          case 6: pv_rows<6>(p, ld, vc, d.E, n, o, c0 > 0); break;
          case 5: pv_rows<5>(p, ld, vc, d.E, n, o, c0 > 0); break;
          case 4: pv_rows<4>(p, ld, vc, d.E, n, o, c0 > 0); break;
          case 3: pv_rows<3>(p, ld, vc, d.E, n, o, c0 > 0); break;
          case 2: pv_rows<2>(p, ld, vc, d.E, n, o, c0 > 0); break;
          default: pv_rows<1>(p, ld, vc, d.E, n, o, c0 > 0); break;
        }
      }
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t e = 0; e < d.E; e += 8) store8(orow[r] + e, load8(orow[r] + e) * splat(inv_sum[r]));
  }
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kt,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::S32> window,
                         ffi::Buffer<ffi::S32> n_valid, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = kt.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 3)
    return ffi::Error::InvalidArgument("attention: expects q[B,T,H,E], kt[B,K,E,S], v[B,K,S,E], mask[B,T,S]");
  if (window.element_count() != 1) return ffi::Error::InvalidArgument("attention: window must be a scalar");
  if (n_valid.element_count() != qd[0]) return ffi::Error::InvalidArgument("attention: n_valid must be [B]");
  // The window is an operand, read at run time: one program serves every window (no branch per size).
  AttnShape d{qd[0], qd[1], qd[2], kd[1], 0, qd[3], kd[3], static_cast<int64_t>(*window.typed_data())};
  if (d.KV <= 0 || d.H % d.KV != 0 || kd[0] != d.B || kd[2] != d.E || vd[0] != d.B || vd[1] != d.KV ||
      vd[2] != d.S || vd[3] != d.E || md[0] != d.B || md[1] != d.T || md[2] != d.S || d.E % 8 != 0 ||
      d.W <= 0 || d.W > d.S)
    return ffi::Error::InvalidArgument("attention: inconsistent shapes, head_dim not a multiple of 8 or bad window");
  d.G = d.H / d.KV;
  const float qscale = 1.4426950408889634f / std::sqrt(static_cast<float>(d.E));  // log2(e) / sqrt(E)
  const float* qp = q.typed_data();
  const float* kp = kt.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = mask.typed_data();
  const int32_t* nvp = n_valid.typed_data();
  float* op = out->typed_data();
  const int64_t ld = (d.W + kNr - 1) / kNr * kNr;
  parallel_chunks(pool, d.B * d.KV, [=](int64_t c) {
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(kBlockRows * (ld + d.E));
    if (scratch.size() < need) scratch.resize(need);
    const int64_t b = c / d.KV;
    attend_pair(d, qp, kp, vp, mp, op, qscale, b, c % d.KV, std::clamp<int64_t>(nvp[b], 0, d.T), scratch.data());
  });
  return ffi::Error::Success();
}


// --------------------------------------------------------------------------------- fused MLP (SwiGLU)
// y[b, t] = (silu(x g) * (x u)) d for t < n_valid[b], 0 for the other rows, with [g | u] and d packed
// as panels. Per chunk of valid rows the [rows, 2F] intermediate stays in L2: unfused, the products
// wrote it to memory, XLA's elementwise pass read it back and wrote [rows, F], the down product read
// that (~25 MB per layer of a 64 x 43-token append at F = 384, with the KV cache filling L3).

// silu(g) * u on 8 lanes: g / (1 + e^-g) * u, e^-g as 2^(-g log2 e) clamped to [2^-126, 2^126].
inline v8f silu_mul8(v8f g, v8f u) {
  v8f x = g * splat(-1.4426950408889634f);
  x = x < splat(-126.0f) ? splat(-126.0f) : x;
  x = x > splat(126.0f) ? splat(126.0f) : x;
  return g / (splat(1.0f) + exp2_8(x)) * u;
}

ffi::Error MlpImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> n_valid,
                   ffi::Buffer<ffi::F32> w_gate_up, ffi::Buffer<ffi::F32> w_down, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), nd = n_valid.dimensions(), yd = y->dimensions();
  if (xd.size() != 3 || nd.size() != 1 || nd[0] != xd[0] || yd.size() != 3 || yd[0] != xd[0] || yd[1] != xd[1] ||
      yd[2] != xd[2] || w_gate_up.dimensions().size() != 1 || w_down.dimensions().size() != 1)
    return ffi::Error::InvalidArgument("mlp: expects x[B, T, D], n_valid[B], packed [gate | up], packed down");
  const int64_t B = xd[0], T = xd[1], D = xd[2], F = w_down.element_count() / std::max<int64_t>(1, D);
  if (F * D != w_down.element_count() || w_gate_up.element_count() != D * 2 * F || F % 8 != 0)
    return ffi::Error::InvalidArgument("mlp: packed weights must be [D * 2F] and [F * D] with F a multiple of 8");
  const float* xp = x.typed_data();
  const int32_t* np_ = n_valid.typed_data();
  const float* wg = w_gate_up.typed_data();
  const float* wd = w_down.typed_data();
  float* yp = y->typed_data();
  std::vector<const float*> xr;
  std::vector<float*> yr;
  valid_rows(xp, yp, np_, B, T, D, D, xr, yr);
  const int64_t m = static_cast<int64_t>(xr.size());
  if (m == 0) return ffi::Error::Success();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // Rows per chunk: the intermediate within ~256 KB (L2), and at least two chunks per thread.
  int64_t rows = std::max<int64_t>(kMr, (256 << 10) / (2 * F * 4) / kMr * kMr);
  rows = std::min(rows, std::max<int64_t>(kMr, ((m + 2 * threads - 1) / (2 * threads) + kMr - 1) / kMr * kMr));
  const int64_t chunks = (m + rows - 1) / rows;
  const float* const* xrp = xr.data();
  float* const* yrp = yr.data();
  parallel_chunks(pool, chunks, [=](int64_t c) {
    thread_local std::vector<float> h;
    thread_local std::vector<float*> hr;
    const int64_t r0 = c * rows, nr = std::min(rows, m - r0);
    if (h.size() < static_cast<size_t>(nr * 2 * F)) h.resize(nr * 2 * F);
    hr.resize(nr);
    for (int64_t r = 0; r < nr; ++r) hr[r] = h.data() + r * 2 * F;
    for (int64_t j0 = 0; j0 < 2 * F; j0 += kNr) strip_rows<false>(xrp + r0, wg, hr.data(), nr, D, 2 * F, j0);
    for (int64_t r = 0; r < nr; ++r)  // gate -> silu(gate) * up, in the first F columns
      for (int64_t j = 0; j < F; j += 8) store8(hr[r] + j, silu_mul8(load8(hr[r] + j), load8(hr[r] + F + j)));
    // The down product reads rows of F from rows laid out 2F apart: same pointers, K = F.
    for (int64_t j0 = 0; j0 < D; j0 += kNr)
      strip_rows<false>(const_cast<const float* const*>(hr.data()), wd, yrp + r0, nr, F, D, j0);
  });
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------- q/k norm and rotation
// From the fused [q | k | v] product [B, T, H + 2K, E] of each row's first n_valid tokens: q and k
// heads RMS-normalised (f32 statistics, weights wq / wk) and rotated (half-split RoPE: x cos +
// rotate_half(x) sin with per-token tables [B, T, E]); the other rows' outputs are 0. In XLA these
// were five loop fusions per layer (two reductions, slices, concatenations), ~10% of the 1M rollout.
ffi::Error NormRopeImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> qkv, ffi::Buffer<ffi::S32> n_valid, ffi::Buffer<ffi::F32> wq,
                        ffi::Buffer<ffi::F32> wk, ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin, float eps,
                        ffi::ResultBuffer<ffi::F32> q, ffi::ResultBuffer<ffi::F32> k) {
  const auto xd = qkv.dimensions(), qd = q->dimensions(), kd = k->dimensions(), cd = cos.dimensions();
  if (xd.size() != 4 || qd.size() != 4 || kd.size() != 4 || cd.size() != 3)
    return ffi::Error::InvalidArgument("norm_rope: expects qkv[B, T, H + 2K, E], q[B, T, H, E], k[B, T, K, E]");
  const int64_t B = xd[0], T = xd[1], N = xd[2], E = xd[3], H = qd[2], KV = kd[2];
  if (qd[0] != B || qd[1] != T || qd[3] != E || kd[0] != B || kd[1] != T || kd[3] != E || N != H + 2 * KV ||
      E % 2 != 0 || n_valid.element_count() != B || wq.element_count() != E || wk.element_count() != E ||
      cd[0] != B || cd[1] != T || cd[2] != E || sin.element_count() != B * T * E)
    return ffi::Error::InvalidArgument("norm_rope: inconsistent shapes (or an odd head_dim)");
  const float* xp = qkv.typed_data();
  const int32_t* np_ = n_valid.typed_data();
  const float *wqp = wq.typed_data(), *wkp = wk.typed_data(), *cp = cos.typed_data(), *sp = sin.typed_data();
  float *qp = q->typed_data(), *kp = k->typed_data();
  const int64_t half = E / 2;
  parallel_chunks(pool, B, [=](int64_t b) {
    thread_local std::vector<float> y;
    y.resize(E);
    const int64_t n = std::clamp<int64_t>(np_[b], 0, T);
    for (int64_t t = 0; t < T; ++t) {
      float* qrow = qp + (b * T + t) * H * E;
      float* krow = kp + (b * T + t) * KV * E;
      if (t >= n) {
        std::memset(qrow, 0, sizeof(float) * H * E);
        std::memset(krow, 0, sizeof(float) * KV * E);
        continue;
      }
      const float* c = cp + (b * T + t) * E;
      const float* si = sp + (b * T + t) * E;
      for (int64_t h = 0; h < H + KV; ++h) {
        const float* x = xp + ((b * T + t) * N + h) * E;
        const float* w = h < H ? wqp : wkp;
        float* out = h < H ? qrow + h * E : krow + (h - H) * E;
        // Eight partial sums: one serial sum was a 4-cycle add chain per element (the kernel's cost).
        float ss = 0.f;
        int64_t e = 0;
        if (E % 8 == 0) {
          v8f acc = v8f{};
          for (; e < E; e += 8) acc += load8(x + e) * load8(x + e);
          for (int l = 0; l < 8; ++l) ss += acc[l];
        }
        for (; e < E; ++e) ss += x[e] * x[e];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(E) + eps);
        e = 0;
        if (half % 8 == 0) {  // 8 lanes at a time (written out: GCC did not vectorise the aliased loops)
          const v8f rv = splat(r);
          for (; e < half; e += 8) {
            const v8f lo = load8(w + e) * (load8(x + e) * rv), hi = load8(w + e + half) * (load8(x + e + half) * rv);
            store8(out + e, lo * load8(c + e) - hi * load8(si + e));
            store8(out + e + half, hi * load8(c + e + half) + lo * load8(si + e + half));
          }
          continue;
        }
        for (e = 0; e < E; ++e) y[e] = w[e] * (x[e] * r);
        for (e = 0; e < half; ++e) {
          out[e] = y[e] * c[e] - y[e + half] * si[e];
          out[e + half] = y[e + half] * c[e + half] + y[e] * si[e + half];
        }
      }
    }
  });
  return ffi::Error::Success();
}

// ------------------------------------------------------------------------------------------- packing
// The panel layout rows_matmul and mlp read, for w = [w_0 | w_1 | ...] (all [K, N_i], concatenated along
// columns): full panels [N / kNr][K][kNr], then the last N % kNr columns as [K, N % kNr]. One pass,
// 64-byte rows copied per (panel, k), panels split over threads.
ffi::Error PackPanelsImpl(ffi::ThreadPool pool, ffi::RemainingArgs ws, ffi::ResultBuffer<ffi::F32> out) {
  std::vector<const float*> src;
  std::vector<int64_t> cols;
  int64_t K = -1, N = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    auto w = ws.get<ffi::Buffer<ffi::F32>>(i);
    if (!w.has_value() || w->dimensions().size() != 2)
      return ffi::Error::InvalidArgument("pack_panels: expects f32 matrices [K, N_i]");
    const auto d = w->dimensions();
    if (K >= 0 && d[0] != K) return ffi::Error::InvalidArgument("pack_panels: matrices differ in K");
    K = d[0];
    src.push_back(w->typed_data());
    cols.push_back(d[1]);
    N += d[1];
  }
  if (K < 0 || out->dimensions().size() != 1 || out->dimensions()[0] != K * N)
    return ffi::Error::InvalidArgument("pack_panels: output must be [K * N]");
  // column j of the concatenation -> (matrix, its column)
  std::vector<int64_t> which(N), col(N);
  for (int64_t m = 0, j = 0; m < static_cast<int64_t>(cols.size()); ++m)
    for (int64_t c = 0; c < cols[m]; ++c, ++j) which[j] = m, col[j] = c;
  float* dst = out->typed_data();
  const int64_t panels = (N + kNr - 1) / kNr;
  const int64_t per_chunk = std::max<int64_t>(1, panels / (4 * std::max<int64_t>(1, pool.num_threads())));
  const int64_t chunks = (panels + per_chunk - 1) / per_chunk;
  parallel_chunks(pool, chunks, [&, dst, K, N](int64_t c) {
    for (int64_t p = c * per_chunk; p < std::min(panels, (c + 1) * per_chunk); ++p) {
      const int64_t j0 = p * kNr, width = std::min<int64_t>(kNr, N - j0);
      float* o = dst + j0 * K;
      // one source matrix for the whole panel (the usual case): contiguous row pieces
      const bool one = which[j0] == which[j0 + width - 1];
      for (int64_t k = 0; k < K; ++k, o += width) {
        if (one) {
          const int64_t m = which[j0];
          std::memcpy(o, src[m] + k * cols[m] + col[j0], width * sizeof(float));
        } else {
          for (int64_t j = 0; j < width; ++j) o[j] = src[which[j0 + j]][k * cols[which[j0 + j]] + col[j0 + j]];
        }
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxagentRowsMatmul, RowsMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxagentMlp, MlpImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxagentNormRope, NormRopeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxagentAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxagentPackPanels, PackPanelsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>());
