// The counter-based init's CPU inner loop with AVX2: Philox-4x32-10 on 4 counters at once, the
// uniform, AS 241 and the own log on 4 float64 lanes, with every operation of init_philox.h in
// the same order and no FMA contraction (-ffp-contract=off, titan_avx2_kernels()), so each value
// equals the scalar code's bit for bit (tests/test_init.cpp compares them over millions).
//
// Note [Vector init layout]: a chunk of up to 256 Philox blocks (512 elements) goes in passes,
// each a loop of short independent iterations that the out-of-order core overlaps (one loop
// doing Philox and the polynomials per group was bound by their latency chain: 8.0 vs 5.9 ns
// per element). (1) Philox + uniform for every block. (2) AS 241's central branch for every
// lane; the lanes with |u - 0.5| > 0.425 (15% of draws) are queued without branches (a table
// packs them to the front). (3) The queued tail lanes, 4 at a time: log, sqrt and the r <= 5
// rational; a lane with r > 5 (u < 1.4e-11, about never) takes the scalar quantile. (4)
// float(std * z), interleaved back to element order; a lane whose first draw is outside
// [lo, hi] takes the scalar path (init_value's redraws). Measured alternatives, one thread,
// normal(0, 1): computing the tail for every 4-lane vector that has a tail lane (48% of them)
// and blending, 8.9 ns per element; the scalar quantile for each tail lane, 8.8 ns; queued,
// 5.9 ns; the scalar loop 28 ns. The scalar fallbacks are the baseline-compiled functions of
// init_fill.cpp, so no inline function of init_philox.h is emitted here with AVX2 code.
#include "model/init_fill_avx2.h"

#if defined(TITAN_AVX2_KERNELS) && defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#endif

namespace titan::model::philox {

#if defined(TITAN_AVX2_KERNELS) && defined(__x86_64__)

bool init_avx2_compiled() { return true; }

namespace {

constexpr int kRounds = 10;
constexpr int kChunkGroups = 64;  // groups of 4 Philox blocks (8 elements) per chunk

// kPackTail[mask]: the 32-bit lane permutation that moves the 64-bit lanes set in `mask` (4
// bits) to the front, in order.
struct PackTable {
  alignas(32) int32_t lanes[16][8];
  constexpr PackTable() : lanes() {
    for (int mask = 0; mask < 16; ++mask) {
      int to = 0;
      for (int lane = 0; lane < 4; ++lane)
        if (mask >> lane & 1) {
          lanes[mask][2 * to] = 2 * lane;
          lanes[mask][2 * to + 1] = 2 * lane + 1;
          ++to;
        }
    }
  }
  const int32_t* operator[](int mask) const { return lanes[mask]; }
};
constexpr PackTable kPackTail;

struct RoundKeys {
  __m256i k0[kRounds], k1[kRounds];
};

RoundKeys round_keys(uint64_t seed) {
  RoundKeys keys;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    keys.k0[round] = _mm256_set1_epi64x(k0);
    keys.k1[round] = _mm256_set1_epi64x(k1);
  }
  return keys;
}

// Philox-4x32-10 of the counters (block, block >> 32 & 0xffff, key lo, key hi), attempt 0, for
// blocks block0 + 0..3: one 64-bit lane per counter, each word in its lane's low 32 bits.
// _mm256_mul_epu32 reads only the low halves, so the high halves may carry junk until the end.
inline void philox_4_blocks(uint64_t block0, __m256i key_lo, __m256i key_hi, const RoundKeys& keys,
                            __m256i words[4]) {
  const __m256i block = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(block0)),
                                         _mm256_setr_epi64x(0, 1, 2, 3));
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  __m256i c0 = block;
  __m256i c1 = _mm256_and_si256(_mm256_srli_epi64(block, 32), _mm256_set1_epi64x(0xffff));
  __m256i c2 = key_lo, c3 = key_hi;
  for (int round = 0; round < kRounds; ++round) {
    const __m256i p0 = _mm256_mul_epu32(c0, m0);
    const __m256i p1 = _mm256_mul_epu32(c2, m1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1), keys.k0[round]);
    c1 = p1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3), keys.k1[round]);
    c3 = p0;
  }
  const __m256i low = _mm256_set1_epi64x(0xffffffffu);
  words[0] = _mm256_and_si256(c0, low);
  words[1] = _mm256_and_si256(c1, low);
  words[2] = _mm256_and_si256(c2, low);
  words[3] = _mm256_and_si256(c3, low);
}

inline __m256d splat(double x) { return _mm256_set1_pd(x); }
inline __m256d add(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
inline __m256d sub(__m256d a, __m256d b) { return _mm256_sub_pd(a, b); }
inline __m256d mul(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
inline __m256d div(__m256d a, __m256d b) { return _mm256_div_pd(a, b); }
// (c * r + d): one Horner step, the multiply rounded before the add as in the scalar code.
inline __m256d horner(__m256d acc, __m256d r, double next) { return add(mul(acc, r), splat(next)); }

// The integer-valued double of a 64-bit lane holding an integer below 2^52: exact.
inline __m256d small_int_to_double(__m256i x) {
  const __m256i two52_bits = _mm256_set1_epi64x(0x4330000000000000LL);
  return sub(_mm256_castsi256_pd(_mm256_or_si256(x, two52_bits)), splat(0x1p52));
}

// uniform_of(hi, lo): (2b + 1) / 2^53, b the top 52 bits of hi << 32 | lo; every step exact.
inline __m256d uniform_of(__m256i hi, __m256i lo) {
  const __m256i b = _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(hi, 32), lo), 12);
  const __m256d bd = small_int_to_double(b);
  return mul(add(mul(bd, splat(2.0)), splat(1.0)), splat(0x1p-53));
}

// log_positive of init_philox.h, lane-wise.
inline __m256d log_positive(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  const __m256d field =
      small_int_to_double(_mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)));
  __m256d e = sub(field, splat(1023.0));  // exact: integers below 2^11
  __m256d m = _mm256_castsi256_pd(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000fffffffffffffLL)),
                      _mm256_set1_epi64x(0x3ff0000000000000LL)));
  const __m256d big = _mm256_cmp_pd(m, splat(1.4142135623730951), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, mul(m, splat(0.5)), big);
  e = add(e, _mm256_and_pd(big, splat(1.0)));  // e += 1, exact
  const __m256d s = div(sub(m, splat(1.0)), add(m, splat(1.0)));
  const __m256d s2 = mul(s, s);
  __m256d series = splat(1.0 / 23.0);
  series = horner(series, s2, 1.0 / 21.0);
  series = horner(series, s2, 1.0 / 19.0);
  series = horner(series, s2, 1.0 / 17.0);
  series = horner(series, s2, 1.0 / 15.0);
  series = horner(series, s2, 1.0 / 13.0);
  series = horner(series, s2, 1.0 / 11.0);
  series = horner(series, s2, 1.0 / 9.0);
  series = horner(series, s2, 1.0 / 7.0);
  series = horner(series, s2, 1.0 / 5.0);
  series = horner(series, s2, 1.0 / 3.0);
  const __m256d two_s = mul(splat(2.0), s);
  const __m256d log_m = add(two_s, mul(two_s, mul(s2, series)));
  return add(mul(e, splat(6.93147180369123816490e-01)),
             add(mul(e, splat(1.90821492927058770002e-10)), log_m));
}

// AS 241's central branch (|q| <= 0.425): q * num / den. Lanes outside it get junk (finite).
inline __m256d quantile_central(__m256d q) {
  const __m256d r = sub(splat(0.180625), mul(q, q));
  __m256d num = splat(2.5090809287301226727e+3);
  num = horner(num, r, 3.3430575583588128105e+4);
  num = horner(num, r, 6.7265770927008700853e+4);
  num = horner(num, r, 4.5921953931549871457e+4);
  num = horner(num, r, 1.3731693765509461125e+4);
  num = horner(num, r, 1.9715909503065514427e+3);
  num = horner(num, r, 1.3314166789178437745e+2);
  num = horner(num, r, 3.3871328727963666080e0);
  __m256d den = splat(5.2264952788528545610e+3);
  den = horner(den, r, 2.8729085735721942674e+4);
  den = horner(den, r, 3.9307895800092710610e+4);
  den = horner(den, r, 2.1213794301586595867e+4);
  den = horner(den, r, 5.3941960214247511077e+3);
  den = horner(den, r, 6.8718700749205790830e+2);
  den = horner(den, r, 4.2313330701600911252e+1);
  den = horner(den, r, 1.0);
  return div(mul(q, num), den);
}

// AS 241's tail (|q| > 0.425) for 4 values p; lanes with r > 5 take the scalar quantile.
inline __m256d quantile_tail(__m256d p) {
  const __m256d q = sub(p, splat(0.5));
  const __m256d negative = _mm256_cmp_pd(q, splat(0.0), _CMP_LT_OQ);
  __m256d r = _mm256_blendv_pd(sub(splat(1.0), p), p, negative);
  const __m256d sign = _mm256_set1_pd(-0.0);
  r = _mm256_sqrt_pd(_mm256_xor_pd(log_positive(r), sign));  // sqrt(-log(r)), IEEE rounded
  const int far = _mm256_movemask_pd(_mm256_cmp_pd(r, splat(5.0), _CMP_NLE_UQ));
  r = sub(r, splat(1.6));
  __m256d num = splat(7.74545014278341407640e-4);
  num = horner(num, r, 2.27238449892691845833e-2);
  num = horner(num, r, 2.41780725177450611770e-1);
  num = horner(num, r, 1.27045825245236838258e0);
  num = horner(num, r, 3.64784832476320460504e0);
  num = horner(num, r, 5.76949722146069140550e0);
  num = horner(num, r, 4.63033784615654529590e0);
  num = horner(num, r, 1.42343711074968357734e0);
  __m256d den = splat(1.05075007164441684324e-9);
  den = horner(den, r, 5.47593808499534494600e-4);
  den = horner(den, r, 1.51986665636164571966e-2);
  den = horner(den, r, 1.48103976427480074590e-1);
  den = horner(den, r, 6.89767334985100004550e-1);
  den = horner(den, r, 1.67638483018380384940e0);
  den = horner(den, r, 2.05319162663775882187e0);
  den = horner(den, r, 1.0);
  __m256d value = _mm256_xor_pd(div(num, den), _mm256_and_pd(negative, sign));  // q < 0: -value
  if (far) {
    alignas(32) double lanes_p[4], lanes_z[4];
    _mm256_store_pd(lanes_p, p);
    _mm256_store_pd(lanes_z, value);
    for (int lane = 0; lane < 4; ++lane)
      if (far >> lane & 1) lanes_z[lane] = normal_quantile_scalar(lanes_p[lane]);
    value = _mm256_load_pd(lanes_z);
  }
  return value;
}

// Elements 2 * block0 .. 2 * (block0 + 4 * groups) - 1 into out (groups <= kChunkGroups), the
// passes of Note [Vector init layout].
void fill_chunk(float* out, uint64_t block0, int groups, uint64_t seed, uint64_t key,
                const RoundKeys& keys, double std, double lo, double hi) {
  // z: per group of 4 blocks, the 4 even elements' uniforms (then normals), then the 4 odd ones'.
  alignas(32) double z[8 * kChunkGroups];
  alignas(32) double tail_p[8 * kChunkGroups + 4];
  alignas(32) int64_t tail_at[8 * kChunkGroups + 4];
  const __m256i lane_index = _mm256_setr_epi64x(0, 1, 2, 3);
  int tails = 0;
  const __m256i key_lo = _mm256_set1_epi64x(static_cast<uint32_t>(key));
  const __m256i key_hi = _mm256_set1_epi64x(static_cast<uint32_t>(key >> 32));
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  for (int g = 0; g < groups; ++g) {
    __m256i words[4];
    philox_4_blocks(block0 + 4 * static_cast<uint64_t>(g), key_lo, key_hi, keys, words);
    _mm256_store_pd(z + 8 * g, uniform_of(words[0], words[1]));
    _mm256_store_pd(z + 8 * g + 4, uniform_of(words[2], words[3]));
  }
  for (int at = 0; at < 8 * groups; at += 4) {
    const __m256d u = _mm256_load_pd(z + at);
    const __m256d q = sub(u, splat(0.5));
    _mm256_store_pd(z + at, quantile_central(q));
    const int tail = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(q, abs_mask), splat(0.425), _CMP_NLE_UQ));
    // Branch-free queueing (tail lanes are random: a branch per lane would mispredict often):
    // the tail lanes' u and positions packed to the front, all 4 stored, `tails` advanced.
    const __m256i pack = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPackTail[tail]));
    _mm256_storeu_pd(tail_p + tails, _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(u), pack)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tail_at + tails),
                        _mm256_permutevar8x32_epi32(_mm256_add_epi64(_mm256_set1_epi64x(at), lane_index), pack));
    tails += __builtin_popcount(static_cast<unsigned>(tail));
  }
  for (int t = 0; t < tails; t += 4) {
    for (int pad = tails; pad < t + 4; ++pad) tail_p[pad] = 0.01;  // any value in (0, 1)
    alignas(32) double values[4];
    _mm256_store_pd(values, quantile_tail(_mm256_load_pd(tail_p + t)));
    for (int k = t; k < std::min(tails, t + 4); ++k) z[tail_at[k]] = values[k - t];
  }
  const __m256d std_v = splat(std), lo_v = splat(lo), hi_v = splat(hi);
  for (int g = 0; g < groups; ++g) {
    const __m256d even = mul(std_v, _mm256_load_pd(z + 8 * g));
    const __m256d odd = mul(std_v, _mm256_load_pd(z + 8 * g + 4));
    const int inside = _mm256_movemask_pd(_mm256_and_pd(
                           _mm256_cmp_pd(even, lo_v, _CMP_GE_OQ), _mm256_cmp_pd(even, hi_v, _CMP_LE_OQ))) |
                       _mm256_movemask_pd(_mm256_and_pd(
                           _mm256_cmp_pd(odd, lo_v, _CMP_GE_OQ), _mm256_cmp_pd(odd, hi_v, _CMP_LE_OQ)))
                           << 4;
    const __m128 even_f = _mm256_cvtpd_ps(even), odd_f = _mm256_cvtpd_ps(odd);  // round to nearest
    float* dst = out + 8 * g;
    _mm_storeu_ps(dst, _mm_unpacklo_ps(even_f, odd_f));  // e0 o0 e1 o1
    _mm_storeu_ps(dst + 4, _mm_unpackhi_ps(even_f, odd_f));
    if (inside != 0xff) {
      for (int lane = 0; lane < 8; ++lane) {
        if (inside >> lane & 1) continue;
        const int element = 2 * (lane & 3) + (lane >> 2);
        fill_run_scalar(dst + element, 2 * (block0 + 4 * static_cast<uint64_t>(g)) + element, 1, seed,
                        key, std, lo, hi);
      }
    }
  }
}

}  // namespace

void fill_run_avx2(float* out, uint64_t first, int64_t n, uint64_t seed, uint64_t key, double std,
                   double lo, double hi) {
  int64_t i = 0;
  if (n > 0 && (first & 1)) {  // an odd first element: its block's even half is not ours
    fill_run_scalar(out, first, 1, seed, key, std, lo, hi);
    i = 1;
  }
  const RoundKeys keys = round_keys(seed);
  const int64_t groups = (n - i) / 8;
  for (int64_t g = 0; g < groups; g += kChunkGroups) {
    const int chunk = static_cast<int>(std::min<int64_t>(kChunkGroups, groups - g));
    fill_chunk(out + i, (first + static_cast<uint64_t>(i)) >> 1, chunk, seed, key, keys, std, lo, hi);
    i += 8 * static_cast<int64_t>(chunk);
  }
  // Fewer than 8 left: the scalar pairs and a last odd element.
  fill_run_scalar(out + i, first + static_cast<uint64_t>(i), n - i, seed, key, std, lo, hi);
}

void normal_quantile_avx2(const double* p, double* z, int64_t n) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d u = _mm256_loadu_pd(p + i);
    const __m256d q = sub(u, splat(0.5));
    const __m256d tail = _mm256_cmp_pd(_mm256_and_pd(q, abs_mask), splat(0.425), _CMP_NLE_UQ);
    __m256d value = quantile_central(q);
    if (_mm256_movemask_pd(tail)) value = _mm256_blendv_pd(value, quantile_tail(u), tail);
    _mm256_storeu_pd(z + i, value);
  }
  if (i < n) {  // the last 1-3 values, padded to a vector
    alignas(32) double lanes_p[4] = {0.5, 0.5, 0.5, 0.5}, lanes_z[4];
    std::copy(p + i, p + n, lanes_p);
    normal_quantile_avx2(lanes_p, lanes_z, 4);
    std::copy(lanes_z, lanes_z + (n - i), z + i);
  }
}

#else  // not x86-64: the scalar loop

bool init_avx2_compiled() { return false; }

void fill_run_avx2(float* out, uint64_t first, int64_t n, uint64_t seed, uint64_t key, double std,
                   double lo, double hi) {
  fill_run_scalar(out, first, n, seed, key, std, lo, hi);
}

void normal_quantile_avx2(const double* p, double* z, int64_t n) {
  for (int64_t i = 0; i < n; ++i) z[i] = normal_quantile_scalar(p[i]);
}

#endif

}  // namespace titan::model::philox
