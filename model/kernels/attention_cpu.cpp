// The CPU attention kernels of model/kernels/attention.h: each (batch, head) one task on the
// intra-op threads, its keys and values converted to float32 once, its queries taken in tiles
// of kTileRows rows whose whole score rows fit in cache (Note [CPU attention by query tiles]).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/kernels/attention.h"

namespace titan::model::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kV = Vec::size();

// Note [CPU attention by query tiles]: a tile of query rows against every key it may see, with
// the whole score row in float32 (not the flash kernel's online softmax over key blocks): the
// softmax of a row is then exact in one pass, and each product below is one small GEMM over
// contiguous float32 rows. Every GEMM is an outer-product loop (C row += a * B row) over a
// register block of 4 rows x 16 columns, vectorized along C's rows, so head_dim 16 runs nearly
// as fast per FLOP as 128 (the debug model's backward: 0.9 ms per layer against LibTorch's bf16
// flash kernel's 8.3). Tiles of 32 rows bound the causal waste (the masked upper triangle
// inside a tile) to 1/(2 x tiles); the score rows of a tile stay within kScoreBudget floats, so
// very long key ranges take thinner tiles.
constexpr int64_t kTileRows = 32;
constexpr int64_t kScoreBudget = int64_t{1} << 19;  // floats: 2 MiB per thread for scores, 2 for their gradient

int64_t tile_rows(int64_t kv_len) {
  return std::max<int64_t>(4, std::min<int64_t>(kTileRows, kScoreBudget / std::max<int64_t>(1, kv_len)) / 4 * 4);
}

// ---- C[m, :n] (+)= sum_k A(m, k) * B[k, :n]: A(m, k) = a[m * a_rs + k * a_cs], B's rows ldb
// apart and contiguous, C's ldc apart. A register block of MR rows x two vectors of columns.

template <int MR, bool Full>
void gemm_block(int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
                int64_t ldc, int64_t n, bool accumulate) {
  const int64_t n0 = Full ? kV : std::min(n, kV), n1 = Full ? kV : std::max<int64_t>(0, n - kV);
  Vec acc[MR][2];  // fully unrolled below, so the accumulators live in registers
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (accumulate) {
      acc[r][0] = Full ? Vec::loadu(c + r * ldc) : Vec::loadu(c + r * ldc, n0);
      acc[r][1] = Full ? Vec::loadu(c + r * ldc + kV) : (n1 > 0 ? Vec::loadu(c + r * ldc + kV, n1) : Vec(0.f));
    } else {
      acc[r][0] = acc[r][1] = Vec(0.f);
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    const Vec b0 = Full ? Vec::loadu(bk) : Vec::loadu(bk, n0);
    const Vec b1 = Full ? Vec::loadu(bk + kV) : (n1 > 0 ? Vec::loadu(bk + kV, n1) : Vec(0.f));
    const float* ak = a + k * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const Vec ar(ak[r * a_rs]);
      acc[r][0] = at::vec::fmadd(ar, b0, acc[r][0]);
      acc[r][1] = at::vec::fmadd(ar, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (Full) {
      acc[r][0].store(c + r * ldc);
      acc[r][1].store(c + r * ldc + kV);
    } else {
      acc[r][0].store(c + r * ldc, n0);
      if (n1 > 0) acc[r][1].store(c + r * ldc + kV, n1);
    }
  }
}

// B's layout: element (k, n) at b[(n / kNr) * block_stride + k * ldb + n % kNr]. Row-major B:
// block_stride kNr (rows ldb apart); packed panels (pack_panels): block_stride K x kNr, ldb kNr.
constexpr int64_t kNr = 2 * kV;
struct BLayout {
  int64_t ldb, block_stride;
};
BLayout row_major(int64_t ldb) { return {ldb, kNr}; }

// The depth of one pass: a depth slice of a B column block (kKc x kNr floats) stays in L1 while
// every row block of A passes over it.
constexpr int64_t kKc = 128;

void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b, BLayout bl,
          float* c, int64_t ldc, bool accumulate) {
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t depth = std::min(kKc, K - k0);
    const bool acc = accumulate || k0 > 0;
    const float* ak = a + k0 * a_cs;
    for (int64_t j = 0; j < N; j += kNr) {
      const float* bj = b + (j / kNr) * bl.block_stride + k0 * bl.ldb;
      const int64_t n = std::min(kNr, N - j);
      int64_t m = 0;
      if (n == kNr) {
        for (; m + 4 <= M; m += 4)
          gemm_block<4, true>(depth, ak + m * a_rs, a_rs, a_cs, bj, bl.ldb, c + m * ldc + j, ldc, n, acc);
        for (; m < M; ++m)
          gemm_block<1, true>(depth, ak + m * a_rs, a_rs, a_cs, bj, bl.ldb, c + m * ldc + j, ldc, n, acc);
      } else {
        for (; m + 4 <= M; m += 4)
          gemm_block<4, false>(depth, ak + m * a_rs, a_rs, a_cs, bj, bl.ldb, c + m * ldc + j, ldc, n, acc);
        for (; m < M; ++m)
          gemm_block<1, false>(depth, ak + m * a_rs, a_rs, a_cs, bj, bl.ldb, c + m * ldc + j, ldc, n, acc);
      }
    }
  }
}

// src [n, hd] (a head's keys or values, row-major) as B = src^T [hd, n] in column panels of kNr
// keys, each [hd, kNr] contiguous and zero-padded past n: the score GEMMs then read B
// sequentially (a plain transpose puts consecutive k a whole key row apart: at 2k keys, a page).
void pack_panels(const float* src, int64_t n, int64_t hd, float* panels) {
  for (int64_t j0 = 0; j0 < n; j0 += kNr) {
    float* panel = panels + (j0 / kNr) * hd * kNr;
    const int64_t cols = std::min(kNr, n - j0);
    for (int64_t d = 0; d < hd; ++d) {
      float* row = panel + d * kNr;
      for (int64_t c = 0; c < cols; ++c) row[c] = src[(j0 + c) * hd + d];
      for (int64_t c = cols; c < kNr; ++c) row[c] = 0.f;
    }
  }
}
int64_t panels_size(int64_t n, int64_t hd) { return (n + kNr - 1) / kNr * kNr * hd; }
BLayout panels_layout(int64_t hd) { return {kNr, hd * kNr}; }

// ---- conversions

void load_row(const at::BFloat16* src, float* dst, int64_t n) { at::vec::convert(src, dst, n); }
void store_row(const float* src, float* dst, int64_t n) { std::copy(src, src + n, dst); }
void store_row(const float* src, at::BFloat16* dst, int64_t n) {
  at::vec::convert(src, dst, n);  // round to nearest even
}

// rows [0, n) of a head (rows `stride` apart) into a contiguous float32 [n, hd] buffer, and
// optionally packed as B = rows^T (pack_panels).
void load_rows(const at::BFloat16* src, int64_t stride, int64_t n, int64_t hd, float* rows, float* panels) {
  for (int64_t i = 0; i < n; ++i) load_row(src + i * stride, rows + i * hd, hd);
  if (panels != nullptr) pack_panels(rows, n, hd, panels);
}

float max_of(const float* x, int64_t n) {
  Vec m(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kV <= n; j += kV) m = at::vec::maximum(m, Vec::loadu(x + j));
  float r = at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return at::vec::maximum(u, w); }, m);
  for (; j < n; ++j) r = std::max(r, x[j]);
  return r;
}

float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kV <= n; i += kV) acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  float s = at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return u + w; }, acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// p[j] = exp(s[j] * scale - shift) for j < valid, 0 for valid <= j < n; returns their sum. The
// tail goes through the same vector exp (masked), so a key's p does not depend on where it sits
// in the block: a ring step's blocks give the whole attention's bits for each key.
float exp_row(float* s, int64_t valid, int64_t n, float scale, float shift) {
  const Vec vscale(scale), vshift(shift);
  Vec acc(0.f);
  for (int64_t j = 0; j < valid; j += kV) {
    const int64_t count = std::min(kV, valid - j);
    const Vec p = (Vec::loadu(s + j, count) * vscale - vshift).exp_u20();
    p.store(s + j, count);
    acc = acc + (count == kV ? p : Vec::set(Vec(0.f), p, count));
  }
  std::fill(s + valid, s + n, 0.f);
  return at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return u + w; }, acc);
}

// Keys query row i of a tile may see: all of them, or (causal, square) keys 0..i.
int64_t visible_keys(const AttentionDims& d, int64_t i) { return d.causal ? i + 1 : d.kv_len; }

}  // namespace

template <typename T>
void attention_forward_cpu(const AttentionDims& d, const T* q, RowStrides qs, const T* k, RowStrides ks, const T* v,
                           RowStrides vs, T* out, float* lse) {
  const int64_t hd = d.head_dim, Sq = d.q_len, Sk = d.kv_len, group = d.heads / d.kv_heads;
  const int64_t tile = tile_rows(Sk);
  at::parallel_for(0, d.batch * d.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(static_cast<size_t>(panels_size(Sk, hd))), vrows(static_cast<size_t>(Sk * hd)),
        krows(vrows.size());
    std::vector<float> qtile(static_cast<size_t>(tile * hd)), otile(qtile.size()),
        scores(static_cast<size_t>(tile * Sk));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / d.heads, h = task % d.heads, kvh = h / group;
      load_rows(k + b * ks.batch + kvh * ks.head, ks.row, Sk, hd, krows.data(), kt.data());
      load_rows(v + b * vs.batch + kvh * vs.head, vs.row, Sk, hd, vrows.data(), nullptr);
      const T* qh = q + b * qs.batch + h * qs.head;
      T* oh = out + task * Sq * hd;
      float* lh = lse + task * Sq;
      for (int64_t i0 = 0; i0 < Sq; i0 += tile) {
        const int64_t rows = std::min(tile, Sq - i0), keys = d.causal ? i0 + rows : Sk;
        load_rows(qh + i0 * qs.row, qs.row, rows, hd, qtile.data(), nullptr);
        // scores[r, j] = q_r . k_j (scaled in the exponent below)
        gemm(rows, keys, hd, qtile.data(), hd, 1, kt.data(), panels_layout(hd), scores.data(), keys, false);
        for (int64_t r = 0; r < rows; ++r) {
          float* s = scores.data() + r * keys;
          const int64_t valid = visible_keys(d, i0 + r);
          const float m = max_of(s, valid) * d.scale;
          const float sum = exp_row(s, valid, keys, d.scale, m);
          lh[i0 + r] = m + std::log(sum);
          const Vec inv(1.f / sum);
          int64_t j = 0;
          for (; j + kV <= valid; j += kV) (Vec::loadu(s + j) * inv).store(s + j);
          for (; j < valid; ++j) s[j] *= 1.f / sum;
        }
        gemm(rows, hd, keys, scores.data(), keys, 1, vrows.data(), row_major(hd), otile.data(), hd, false);  // P V
        for (int64_t r = 0; r < rows; ++r) store_row(otile.data() + r * hd, oh + (i0 + r) * hd, hd);
      }
    }
  });
}

template <typename T, typename G>
void attention_backward_cpu(const AttentionDims& d, const T* dout, RowStrides dos, const T* q, RowStrides qs,
                            const T* k, RowStrides ks, const T* v, RowStrides vs, const T* out, RowStrides os,
                            const float* lse, G* dq, G* dk, G* dv) {
  const int64_t hd = d.head_dim, Sq = d.q_len, Sk = d.kv_len, group = d.heads / d.kv_heads;
  const int64_t tile = tile_rows(Sk);
  // One task per (batch, kv head): its group of query heads adds into one dk / dv, in order.
  at::parallel_for(0, d.batch * d.kv_heads, 1, [&](int64_t begin, int64_t end) {
    const size_t kv_elems = static_cast<size_t>(Sk * hd), tile_elems = static_cast<size_t>(tile * hd);
    const size_t panel_elems = static_cast<size_t>(panels_size(Sk, hd));
    std::vector<float> krows(kv_elems), kt(panel_elems), vt(panel_elems), vscratch(kv_elems), dk_acc(kv_elems),
        dv_acc(kv_elems);
    std::vector<float> qtile(tile_elems), dotile(tile_elems), otile(tile_elems), dqtile(tile_elems);
    std::vector<float> p(static_cast<size_t>(tile * Sk)), ds(p.size()), rowdot(static_cast<size_t>(tile));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / d.kv_heads, kvh = task % d.kv_heads;
      load_rows(k + b * ks.batch + kvh * ks.head, ks.row, Sk, hd, krows.data(), kt.data());
      load_rows(v + b * vs.batch + kvh * vs.head, vs.row, Sk, hd, vscratch.data(), vt.data());
      std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t qhead = b * d.heads + h;
        const T* qh = q + b * qs.batch + h * qs.head;
        const T* doh = dout + b * dos.batch + h * dos.head;
        const T* oh = out + b * os.batch + h * os.head;
        const float* lh = lse + qhead * Sq;
        G* dqh = dq + qhead * Sq * hd;
        for (int64_t i0 = 0; i0 < Sq; i0 += tile) {
          const int64_t rows = std::min(tile, Sq - i0), keys = d.causal ? i0 + rows : Sk;
          load_rows(qh + i0 * qs.row, qs.row, rows, hd, qtile.data(), nullptr);
          load_rows(doh + i0 * dos.row, dos.row, rows, hd, dotile.data(), nullptr);
          load_rows(oh + i0 * os.row, os.row, rows, hd, otile.data(), nullptr);
          gemm(rows, keys, hd, qtile.data(), hd, 1, kt.data(), panels_layout(hd), p.data(), keys, false);  // scores
          gemm(rows, keys, hd, dotile.data(), hd, 1, vt.data(), panels_layout(hd), ds.data(), keys,
               false);  // dP = dO V^T
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p.data() + r * keys;
            float* dsr = ds.data() + r * keys;
            const int64_t valid = visible_keys(d, i0 + r);
            exp_row(pr, valid, keys, d.scale, lh[i0 + r]);  // P = exp(s * scale - lse)
            // dS = P * (dP - rowsum(dO * O)) * scale; the scale of s = scale * q k^T folded in here
            const float delta = dot(dotile.data() + r * hd, otile.data() + r * hd, hd);
            const Vec vdelta(delta), vscale(d.scale);
            int64_t j = 0;
            for (; j + kV <= valid; j += kV)
              (Vec::loadu(pr + j) * (Vec::loadu(dsr + j) - vdelta) * vscale).store(dsr + j);
            for (; j < valid; ++j) dsr[j] = pr[j] * (dsr[j] - delta) * d.scale;
            std::fill(dsr + valid, dsr + keys, 0.f);
          }
          gemm(rows, hd, keys, ds.data(), keys, 1, krows.data(), row_major(hd), dqtile.data(), hd, false);  // dQ = dS K
          gemm(keys, hd, rows, ds.data(), 1, keys, qtile.data(), row_major(hd), dk_acc.data(), hd,
               true);  // dK += dS^T Q
          gemm(keys, hd, rows, p.data(), 1, keys, dotile.data(), row_major(hd), dv_acc.data(), hd,
               true);  // dV += P^T dO
          for (int64_t r = 0; r < rows; ++r) store_row(dqtile.data() + r * hd, dqh + (i0 + r) * hd, hd);
        }
      }
      G* dkh = dk + task * Sk * hd;
      G* dvh = dv + task * Sk * hd;
      for (int64_t j = 0; j < Sk; ++j) {
        store_row(dk_acc.data() + j * hd, dkh + j * hd, hd);
        store_row(dv_acc.data() + j * hd, dvh + j * hd, hd);
      }
    }
  });
}

template void attention_forward_cpu<at::BFloat16>(const AttentionDims&, const at::BFloat16*, RowStrides,
                                                  const at::BFloat16*, RowStrides, const at::BFloat16*, RowStrides,
                                                  at::BFloat16*, float*);
#define TITAN_ATTENTION_BACKWARD(G)                                                                                \
  template void attention_backward_cpu<at::BFloat16, G>(                                                           \
      const AttentionDims&, const at::BFloat16*, RowStrides, const at::BFloat16*, RowStrides, const at::BFloat16*, \
      RowStrides, const at::BFloat16*, RowStrides, const at::BFloat16*, RowStrides, const float*, G*, G*, G*);
TITAN_ATTENTION_BACKWARD(at::BFloat16)
TITAN_ATTENTION_BACKWARD(float)
#undef TITAN_ATTENTION_BACKWARD

}  // namespace titan::model::kernels
