// The CPU attention kernel's products in bf16 dot products (AVX512-BF16's vdpbf16ps: 32 bf16
// multiply-adds into 16 float32 lanes per instruction, twice float32 FMA's rate on the CPUs that
// have it). See Note [CPU attention products] in attention_cpu.cpp.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "model/kernels/attention.h"
#include "model/kernels/attention_cpu_products.h"

namespace titan::model::kernels {

#if defined(__AVX512BF16__)
namespace {

// Columns per panel: two vectors of 16 float32 lanes.
constexpr int64_t kNr = 32;

uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }
uint16_t bits(at::BFloat16 x) { return x.x; }
uint16_t bits(float x) { return at::BFloat16(x).x; }  // round to nearest even

int64_t pairs_of(int64_t k) { return (k + 1) / 2; }
int64_t panels_size(int64_t k, int64_t n) { return (n + kNr - 1) / kNr * pairs_of(k) * kNr; }

// The right operand B [K, N] (element (k, n) = get(k, n)) as panels of kNr columns, each
// [pairs_of(K)][kNr] of (B(2p, n), B(2p + 1, n)) pairs: what one vdpbf16ps lane multiplies.
// Zero past K and N.
template <typename Get>
void pack_b(int64_t K, int64_t N, Get get, uint32_t* out) {
  const int64_t kp = pairs_of(K);
  for (int64_t j0 = 0; j0 < N; j0 += kNr) {
    uint32_t* panel = out + (j0 / kNr) * kp * kNr;
    const int64_t cols = std::min(kNr, N - j0);
    for (int64_t p = 0; p < kp; ++p) {
      uint32_t* row = panel + p * kNr;
      for (int64_t c = 0; c < cols; ++c)
        row[c] = pair(bits(get(2 * p, j0 + c)), 2 * p + 1 < K ? bits(get(2 * p + 1, j0 + c)) : uint16_t{0});
      std::fill(row + cols, row + kNr, 0u);
    }
  }
}

// The left operand A [M, K] (element (m, k) = get(m, k)) as rows of pairs (A(m, 2p), A(m, 2p+1)).
template <typename Get>
void pack_a(int64_t M, int64_t K, Get get, uint32_t* out) {
  const int64_t kp = pairs_of(K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = 0; p < kp; ++p)
      out[m * kp + p] = pair(bits(get(m, 2 * p)), 2 * p + 1 < K ? bits(get(m, 2 * p + 1)) : uint16_t{0});
}

template <int MR>
void dot_block(int64_t kp, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, int64_t n, bool accumulate) {
  const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(n >= 32 ? 0xFFFF : n <= 16 ? 0 : (1u << (n - 16)) - 1);
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = accumulate ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = accumulate ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kNr);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kNr + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * kp + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc[r][1]);
  }
}

// C [M, N] (+)= A B over K rows of B: A packed by pack_a (K columns), B by pack_b from b_rows >= K
// rows (its panels b_rows / 2 pairs apart; a tile multiplies over its key range, `b` then points
// at the range's first pair: an even first key).
void dot_gemm(int64_t M, int64_t N, int64_t K, const uint32_t* a, const uint32_t* b, int64_t b_rows, float* c,
              int64_t ldc, bool accumulate) {
  const int64_t kp = pairs_of(K);
  for (int64_t j = 0; j < N; j += kNr) {
    const uint32_t* panel = b + (j / kNr) * pairs_of(b_rows) * kNr;
    const int64_t n = std::min(kNr, N - j);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) dot_block<4>(kp, a + m * kp, panel, c + m * ldc + j, ldc, n, accumulate);
    for (; m < M; ++m) dot_block<1>(kp, a + m * kp, panel, c + m * ldc + j, ldc, n, accumulate);
  }
}

class Bf16DotProducts final : public HeadProducts {
 public:
  Bf16DotProducts(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim, int64_t tile_rows)
      : sk_(kv_len),
        dqk_(qk_head_dim),
        dv_(v_head_dim),
        k_scores_(static_cast<size_t>(panels_size(qk_head_dim, kv_len))),
        v_probs_(static_cast<size_t>(panels_size(v_head_dim, kv_len))),
        v_out_(static_cast<size_t>(panels_size(kv_len, v_head_dim))),
        k_grad_(static_cast<size_t>(panels_size(kv_len, qk_head_dim))),
        q_a_(static_cast<size_t>(tile_rows * pairs_of(qk_head_dim))),
        do_a_(static_cast<size_t>(tile_rows * pairs_of(v_head_dim))),
        q_b_(static_cast<size_t>(panels_size(tile_rows, qk_head_dim))),
        do_b_(static_cast<size_t>(panels_size(tile_rows, v_head_dim))),
        lhs_(static_cast<size_t>(std::max(tile_rows * pairs_of(kv_len), kv_len * pairs_of(tile_rows)))) {}

  void load_kv(const at::BFloat16* k, int64_t k_stride, const at::BFloat16* v, int64_t v_stride) override {
    auto key = [&](int64_t j, int64_t d) { return k[j * k_stride + d]; };
    auto value = [&](int64_t j, int64_t d) { return v[j * v_stride + d]; };
    pack_b(
        dqk_, sk_, [&](int64_t d, int64_t j) { return key(j, d); }, k_scores_.data());  // q k^T
    pack_b(
        dv_, sk_, [&](int64_t d, int64_t j) { return value(j, d); }, v_probs_.data());  // dO v^T
    pack_b(sk_, dv_, value, v_out_.data());                                             // p v
    pack_b(sk_, dqk_, key, k_grad_.data());                                             // ds k
  }
  void load_q(const at::BFloat16* q, int64_t stride, int64_t rows) override {
    pack_tile(q, stride, rows, dqk_, q_a_.data(), q_b_.data());
  }
  void load_dout(const at::BFloat16* dout, int64_t stride, int64_t rows) override {
    pack_tile(dout, stride, rows, dv_, do_a_.data(), do_b_.data());
  }
  int64_t key_alignment() const override { return kNr; }  // one panel of k_scores_ / v_probs_
  void scores(int64_t rows, int64_t key_begin, int64_t keys, float* s) override {
    dot_gemm(rows, keys, dqk_, q_a_.data(), key_panels(k_scores_, key_begin, dqk_), dqk_, s, keys, false);
  }
  void out(int64_t rows, int64_t key_begin, int64_t keys, const float* p, float* o) override {
    pack_a(rows, keys, [&](int64_t r, int64_t j) { return p[r * keys + j]; }, lhs_.data());
    dot_gemm(rows, dv_, keys, lhs_.data(), v_out_.data() + key_begin / 2 * kNr, sk_, o, dv_, false);
  }
  void grad_probs(int64_t rows, int64_t key_begin, int64_t keys, float* dp) override {
    dot_gemm(rows, keys, dv_, do_a_.data(), key_panels(v_probs_, key_begin, dv_), dv_, dp, keys, false);
  }
  void grad_q(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, float* dq) override {
    pack_a(rows, keys, [&](int64_t r, int64_t j) { return ds[r * keys + j]; }, lhs_.data());
    dot_gemm(rows, dqk_, keys, lhs_.data(), k_grad_.data() + key_begin / 2 * kNr, sk_, dq, dqk_, false);
  }
  void grad_kv(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, const float* p, float* dk,
               float* dv) override {
    pack_a(
        keys, rows, [&](int64_t j, int64_t r) { return ds[r * keys + j]; }, lhs_.data());
    dot_gemm(keys, dqk_, rows, lhs_.data(), q_b_.data(), rows, dk + key_begin * dqk_, dqk_, true);
    pack_a(
        keys, rows, [&](int64_t j, int64_t r) { return p[r * keys + j]; }, lhs_.data());
    dot_gemm(keys, dv_, rows, lhs_.data(), do_b_.data(), rows, dv + key_begin * dv_, dv_, true);
  }

 private:
  // The panels of keys as columns (q k^T, dO v^T: `depth` = the head size) from key_begin, a
  // multiple of kNr, on.
  static const uint32_t* key_panels(const std::vector<uint32_t>& panels, int64_t key_begin, int64_t depth) {
    return panels.data() + key_begin / kNr * pairs_of(depth) * kNr;
  }

  // A tile's rows (queries or their output gradients, `width` columns) as the left operand of
  // q k^T / dO v^T and the right one of ds^T q / p^T dO.
  void pack_tile(const at::BFloat16* src, int64_t stride, int64_t rows, int64_t width, uint32_t* as_a,
                 uint32_t* as_b) {
    auto get = [&](int64_t r, int64_t d) { return src[r * stride + d]; };
    pack_a(rows, width, get, as_a);
    pack_b(rows, width, get, as_b);
  }

  int64_t sk_, dqk_, dv_;  // keys, q / k's head size, v's
  std::vector<uint32_t> k_scores_, v_probs_, v_out_, k_grad_, q_a_, do_a_, q_b_, do_b_, lhs_;
};

}  // namespace

bool cpu_has_bf16_dot_products() {
  static const bool ok =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}

std::unique_ptr<HeadProducts> bf16_dot_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                                int64_t tile_rows) {
  if (!cpu_has_bf16_dot_products()) return nullptr;
  return std::make_unique<Bf16DotProducts>(kv_len, qk_head_dim, v_head_dim, tile_rows);
}

#else  // built without AVX512-BF16

bool cpu_has_bf16_dot_products() { return false; }
std::unique_ptr<HeadProducts> bf16_dot_products(int64_t, int64_t, int64_t, int64_t) { return nullptr; }

#endif

AttentionProducts default_attention_products(int64_t qk_head_dim, int64_t v_head_dim) {
  return cpu_has_bf16_dot_products() && std::min(qk_head_dim, v_head_dim) >= kMinHeadDimForDots
             ? AttentionProducts::kBf16Dot
             : AttentionProducts::kFloat32;
}

}  // namespace titan::model::kernels
