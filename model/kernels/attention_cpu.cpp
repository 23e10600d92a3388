// The CPU attention kernels of model/kernels/attention.h: each (batch, head) one task on the
// intra-op threads, its keys and values converted to float32 once, its queries taken in tiles
// of kTileRows rows whose whole score rows fit in cache (Note [CPU attention by query tiles]).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "model/kernels/attention.h"
#include "model/kernels/attention_cpu_products.h"

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
// very long key ranges take thinner tiles. A tile multiplies only over the keys its rows see
// (kernels::tile_keys: from its first row's first key, rounded down to a panel, to its last row's
// last), so a sliding window of W keys costs each tile about W + 32 + a panel of keys, not the
// whole prefix; the keys of that range a row does not see get p = 0 and dS = 0, as the causal
// tail does. An unmasked block and the causal square start at key 0 and end where they did, so
// they give the bits they gave before windows existed.
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

// p[j] = exp(s[j] * scale - shift) for begin <= j < end, 0 elsewhere in [0, n); returns their
// sum. The tail goes through the same vector exp (masked), so a key's p does not depend on where
// it sits in the block: a ring step's blocks give the whole attention's bits for each key.
float exp_row(float* s, int64_t begin, int64_t end, int64_t n, float scale, float shift) {
  const Vec vscale(scale), vshift(shift);
  Vec acc(0.f);
  std::fill(s, s + begin, 0.f);
  for (int64_t j = begin; j < end; j += kV) {
    const int64_t count = std::min(kV, end - j);
    const Vec p = (Vec::loadu(s + j, count) * vscale - vshift).exp_u20();
    p.store(s + j, count);
    acc = acc + (count == kV ? p : Vec::set(Vec(0.f), p, count));
  }
  std::fill(s + end, s + n, 0.f);
  return at::vec::vec_reduce_all<float>([](Vec& u, Vec& w) { return u + w; }, acc);
}

// Query row i's visible keys (kernels::visible_keys) relative to its tile's range `t`.
KeyRange row_keys(const AttentionDims& d, int64_t i, KeyRange t) {
  const KeyRange r = visible_keys(d, i);
  return {r.begin - t.begin, std::max(r.begin, r.end) - t.begin};
}

// Note [CPU attention products]: the tile loop below asks a HeadProducts
// (attention_cpu_products.h) for its seven products, so the loop, the softmax and the masks are
// written once for both ways of multiplying:
// - float32 FMAs (here): each operand converted to float32 once, every product in float32, one
//   rounding per output element;
// - bf16 dot products (attention_cpu_bf16.cpp, CPUs with AVX512-BF16): vdpbf16ps multiplies 32
//   bf16 pairs into 16 float32 lanes per instruction, twice the FMAs' rate. q.k and dO.v are
//   exact products of the bf16 inputs summed in float32, as before; P and dS are rounded to bf16
//   for their products, as LibTorch's flash kernel rounds P. Packing P and dS into pairs costs
//   per element about what the products of a 16-wide head cost, so small heads keep the FMAs
//   (kMinHeadDimForDots, measured in docs/performance.md).

// ---- the float32 products (See Note [CPU attention by query tiles])

class Float32Products final : public HeadProducts {
 public:
  Float32Products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim, int64_t tile_rows)
      : dqk_(qk_head_dim),
        dv_(v_head_dim),
        krows_(static_cast<size_t>(kv_len * qk_head_dim)),
        vrows_(static_cast<size_t>(kv_len * v_head_dim)),
        kt_(static_cast<size_t>(panels_size(kv_len, qk_head_dim))),
        vt_(static_cast<size_t>(panels_size(kv_len, v_head_dim))),
        qtile_(static_cast<size_t>(tile_rows * qk_head_dim)),
        dotile_(static_cast<size_t>(tile_rows * v_head_dim)),
        kv_len_(kv_len) {}

  int64_t key_alignment() const override { return kNr; }  // one panel of kt_ / vt_
  void load_kv(const at::BFloat16* k, int64_t k_stride, const at::BFloat16* v, int64_t v_stride) override {
    load_rows(k, k_stride, kv_len_, dqk_, krows_.data(), kt_.data());
    load_rows(v, v_stride, kv_len_, dv_, vrows_.data(), vt_.data());
  }
  void load_q(const at::BFloat16* q, int64_t stride, int64_t rows) override {
    load_rows(q, stride, rows, dqk_, qtile_.data(), nullptr);
  }
  void load_dout(const at::BFloat16* dout, int64_t stride, int64_t rows) override {
    load_rows(dout, stride, rows, dv_, dotile_.data(), nullptr);
  }
  void scores(int64_t rows, int64_t key_begin, int64_t keys, float* s) override {
    gemm(rows, keys, dqk_, qtile_.data(), dqk_, 1, panels_from(kt_, key_begin, dqk_), panels_layout(dqk_), s, keys,
         false);
  }
  void out(int64_t rows, int64_t key_begin, int64_t keys, const float* p, float* o) override {
    gemm(rows, dv_, keys, p, keys, 1, vrows_.data() + key_begin * dv_, row_major(dv_), o, dv_, false);
  }
  void grad_probs(int64_t rows, int64_t key_begin, int64_t keys, float* dp) override {
    gemm(rows, keys, dv_, dotile_.data(), dv_, 1, panels_from(vt_, key_begin, dv_), panels_layout(dv_), dp, keys,
         false);
  }
  void grad_q(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, float* dq) override {
    gemm(rows, dqk_, keys, ds, keys, 1, krows_.data() + key_begin * dqk_, row_major(dqk_), dq, dqk_, false);
  }
  void grad_kv(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, const float* p, float* dk,
               float* dv) override {
    gemm(keys, dqk_, rows, ds, 1, keys, qtile_.data(), row_major(dqk_), dk + key_begin * dqk_, dqk_, true);
    gemm(keys, dv_, rows, p, 1, keys, dotile_.data(), row_major(dv_), dv + key_begin * dv_, dv_, true);
  }

 private:
  // The panels of keys from key_begin (a multiple of kNr) on.
  static const float* panels_from(const std::vector<float>& panels, int64_t key_begin, int64_t hd) {
    return panels.data() + key_begin / kNr * panels_layout(hd).block_stride;
  }

  int64_t dqk_, dv_;  // q / k's head size, v's
  std::vector<float> krows_, vrows_, kt_, vt_, qtile_, dotile_;
  int64_t kv_len_;
};

std::unique_ptr<HeadProducts> products_for(AttentionProducts which, const AttentionDims& d, int64_t tile) {
  if (which == AttentionProducts::kBf16Dot) {
    if (auto made = bf16_dot_products(d.kv_len, d.qk_head_dim, d.v_head_dim, tile)) return made;
  }
  return float32_products(d.kv_len, d.qk_head_dim, d.v_head_dim, tile);
}

}  // namespace

std::unique_ptr<HeadProducts> float32_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                               int64_t tile_rows) {
  return std::make_unique<Float32Products>(kv_len, qk_head_dim, v_head_dim, tile_rows);
}

void attention_forward_cpu(const AttentionDims& d, const BF16* q, RowStrides qs, const BF16* k, RowStrides ks,
                           const BF16* v, RowStrides vs, BF16* out, float* lse, AttentionProducts which) {
  const int64_t dv = d.v_head_dim, Sq = d.q_len, Sk = d.kv_len, group = d.heads / d.kv_heads;
  const int64_t tile = tile_rows(Sk);
  at::parallel_for(0, d.batch * d.heads, 1, [&](int64_t begin, int64_t end) {
    const std::unique_ptr<HeadProducts> products = products_for(which, d, tile);
    std::vector<float> otile(static_cast<size_t>(tile * dv)), scores(static_cast<size_t>(tile * Sk));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / d.heads, h = task % d.heads, kvh = h / group;
      products->load_kv(k + b * ks.batch + kvh * ks.head, ks.row, v + b * vs.batch + kvh * vs.head, vs.row);
      const BF16* qh = q + b * qs.batch + h * qs.head;
      BF16* oh = out + task * Sq * dv;
      float* lh = lse + task * Sq;
      for (int64_t i0 = 0; i0 < Sq; i0 += tile) {
        const int64_t rows = std::min(tile, Sq - i0);
        const KeyRange t = tile_keys(d, i0, rows, products->key_alignment());
        const int64_t keys = t.end - t.begin;
        if (keys == 0) {  // no row of the tile sees a key
          std::fill(otile.begin(), otile.end(), 0.f);
          for (int64_t r = 0; r < rows; ++r) {
            lh[i0 + r] = -std::numeric_limits<float>::infinity();
            store_row(otile.data(), oh + (i0 + r) * dv, dv);
          }
          continue;
        }
        products->load_q(qh + i0 * qs.row, qs.row, rows);
        products->scores(rows, t.begin, keys, scores.data());  // q_r . k_j, scaled in the exponent below
        for (int64_t r = 0; r < rows; ++r) {
          float* s = scores.data() + r * keys;
          const KeyRange row = row_keys(d, i0 + r, t);
          if (row.begin == row.end) {  // a row that sees no key: p 0, so out 0
            std::fill(s, s + keys, 0.f);
            lh[i0 + r] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float m = max_of(s + row.begin, row.end - row.begin) * d.scale;
          const float sum = exp_row(s, row.begin, row.end, keys, d.scale, m);
          lh[i0 + r] = m + std::log(sum);
          const Vec inv(1.f / sum);
          int64_t j = row.begin;
          for (; j + kV <= row.end; j += kV) (Vec::loadu(s + j) * inv).store(s + j);
          for (; j < row.end; ++j) s[j] *= 1.f / sum;
        }
        products->out(rows, t.begin, keys, scores.data(), otile.data());
        for (int64_t r = 0; r < rows; ++r) store_row(otile.data() + r * dv, oh + (i0 + r) * dv, dv);
      }
    }
  });
}

template <typename G>
void attention_backward_cpu(const AttentionDims& d, const BF16* dout, RowStrides dos, const BF16* q, RowStrides qs,
                            const BF16* k, RowStrides ks, const BF16* v, RowStrides vs, const BF16* out,
                            RowStrides os, const float* lse, G* dq, G* dk, G* dv_out, AttentionProducts which) {
  const int64_t dqk = d.qk_head_dim, dv = d.v_head_dim, Sq = d.q_len, Sk = d.kv_len, group = d.heads / d.kv_heads;
  const int64_t tile = tile_rows(Sk);
  // One task per (batch, kv head): its group of query heads adds into one dk / dv, in order.
  at::parallel_for(0, d.batch * d.kv_heads, 1, [&](int64_t begin, int64_t end) {
    const std::unique_ptr<HeadProducts> products = products_for(which, d, tile);
    std::vector<float> dk_acc(static_cast<size_t>(Sk * dqk)), dv_acc(static_cast<size_t>(Sk * dv));
    std::vector<float> dotile(static_cast<size_t>(tile * dv)), otile(dotile.size());
    std::vector<float> dqtile(static_cast<size_t>(tile * dqk));
    std::vector<float> p(static_cast<size_t>(tile * Sk)), ds(p.size());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / d.kv_heads, kvh = task % d.kv_heads;
      products->load_kv(k + b * ks.batch + kvh * ks.head, ks.row, v + b * vs.batch + kvh * vs.head, vs.row);
      std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t qhead = b * d.heads + h;
        const BF16* qh = q + b * qs.batch + h * qs.head;
        const BF16* doh = dout + b * dos.batch + h * dos.head;
        const BF16* oh = out + b * os.batch + h * os.head;
        const float* lh = lse + qhead * Sq;
        G* dqh = dq + qhead * Sq * dqk;
        for (int64_t i0 = 0; i0 < Sq; i0 += tile) {
          const int64_t rows = std::min(tile, Sq - i0);
          const KeyRange t = tile_keys(d, i0, rows, products->key_alignment());
          const int64_t keys = t.end - t.begin;
          if (keys == 0) {  // no row of the tile sees a key: dq 0, nothing for dk / dv
            std::fill(dqtile.begin(), dqtile.end(), 0.f);
            for (int64_t r = 0; r < rows; ++r) store_row(dqtile.data(), dqh + (i0 + r) * dqk, dqk);
            continue;
          }
          products->load_q(qh + i0 * qs.row, qs.row, rows);
          products->load_dout(doh + i0 * dos.row, dos.row, rows);
          load_rows(doh + i0 * dos.row, dos.row, rows, dv, dotile.data(), nullptr);  // for rowsum(dO * O)
          load_rows(oh + i0 * os.row, os.row, rows, dv, otile.data(), nullptr);
          products->scores(rows, t.begin, keys, p.data());
          products->grad_probs(rows, t.begin, keys, ds.data());  // dP = dO V^T
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p.data() + r * keys;
            float* dsr = ds.data() + r * keys;
            const KeyRange row = row_keys(d, i0 + r, t);
            if (row.begin == row.end) {  // a row that sees no key: P 0, dS 0 (whatever its lse)
              std::fill(pr, pr + keys, 0.f);
              std::fill(dsr, dsr + keys, 0.f);
              continue;
            }
            exp_row(pr, row.begin, row.end, keys, d.scale, lh[i0 + r]);  // P = exp(s * scale - lse)
            // dS = P * (dP - rowsum(dO * O)) * scale; the scale of s = scale * q k^T folded in here
            const float delta = dot(dotile.data() + r * dv, otile.data() + r * dv, dv);
            const Vec vdelta(delta), vscale(d.scale);
            std::fill(dsr, dsr + row.begin, 0.f);
            int64_t j = row.begin;
            for (; j + kV <= row.end; j += kV)
              (Vec::loadu(pr + j) * (Vec::loadu(dsr + j) - vdelta) * vscale).store(dsr + j);
            for (; j < row.end; ++j) dsr[j] = pr[j] * (dsr[j] - delta) * d.scale;
            std::fill(dsr + row.end, dsr + keys, 0.f);
          }
          products->grad_q(rows, t.begin, keys, ds.data(), dqtile.data());
          products->grad_kv(rows, t.begin, keys, ds.data(), p.data(), dk_acc.data(), dv_acc.data());
          for (int64_t r = 0; r < rows; ++r) store_row(dqtile.data() + r * dqk, dqh + (i0 + r) * dqk, dqk);
        }
      }
      G* dkh = dk + task * Sk * dqk;
      G* dvh = dv_out + task * Sk * dv;
      for (int64_t j = 0; j < Sk; ++j) {
        store_row(dk_acc.data() + j * dqk, dkh + j * dqk, dqk);
        store_row(dv_acc.data() + j * dv, dvh + j * dv, dv);
      }
    }
  });
}

#define TITAN_ATTENTION_BACKWARD(G)                                                                             \
  template void attention_backward_cpu<G>(const AttentionDims&, const BF16*, RowStrides, const BF16*, RowStrides, \
                                          const BF16*, RowStrides, const BF16*, RowStrides, const BF16*, RowStrides, \
                                          const float*, G*, G*, G*, AttentionProducts);
TITAN_ATTENTION_BACKWARD(BF16)
TITAN_ATTENTION_BACKWARD(float)
#undef TITAN_ATTENTION_BACKWARD

}  // namespace titan::model::kernels
