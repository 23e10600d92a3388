// model/init_philox.h — the counter-based weight-init generator, shared by the CPU filler
// (init_fill.cpp) and its CUDA twin (init_kernels.cu): the same source compiles for host and
// device, so both run the same float64 operations in the same order. The CPU's AVX2 loop
// (init_fill_avx2.cpp) runs these operations 4 lanes at a time, in the same order.
//
// Note [Counter-based init]: every initial weight is a pure function of
//   (seed, parameter fqn, flat index of the element in the FULL parameter),
// so a rank computes exactly the elements it holds (an FSDP row range of a TP column or row
// chunk, padding left zero) and gets the values a single process has, in every layout, without
// generating or communicating anything else.
//   * fqn -> 64-bit key h by FNV-1a 64 over the fqn's bytes (offset basis 0xcbf29ce484222325,
//     prime 0x100000001b3): stable across compilers, platforms and runs.
//   * Philox-4x32-10 (Salmon et al., SC'11; Random123's constants), key = (seed low 32 bits,
//     seed high 32 bits), counter = (block low 32, block high 16 | attempt << 16, h low 32,
//     h high 32) with block = index / 2: one call gives two elements, element index % 2 == 0
//     takes output words (0, 1), the odd one (2, 3). Holds for tensors below 2^49 elements.
//   * uniform u = (2 * b + 1) / 2^53 with b the top 52 bits of (word_hi << 32 | word_lo):
//     exact in float64, inside (0, 1), symmetric (1 - u is exact too).
//   * standard normal z = Phi^-1(u) by Wichura's AS 241 (PPND16, relative error ~1e-16), whose
//     only non-rational step is sqrt(-log(r)) in the tails (|u - 0.5| > 0.425, 15% of draws).
//     log is this file's own (exponent split + atanh series, + - * / only) and sqrt is IEEE
//     correctly rounded on both sides, so CPU and GPU agree bit for bit: glibc's and CUDA's
//     log/sin/cos/erfinv may differ in the last bit, which is why Box-Muller and erfinv are
//     not used. Both sides must compile this without FMA contraction (-ffp-contract=off,
//     nvcc --fmad=false; set in model/CMakeLists.txt).
//   * value = float(std * z). Truncated normal (torch.nn.init.trunc_normal_(std, a, b), mean
//     0, a and b absolute): a draw outside [a, b] is redrawn from the next attempt's counter
//     (rejection: exactly the truncated distribution). With torchtitan's bounds (output:
//     +-3 std, 0.27% redrawn; layers: +-2 = +-100 std, never) few elements take a second draw.
//     After 2^16 - 1 attempts (probability < 1e-40 for +-3 std) the last draw is clamped.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TITAN_HD __host__ __device__ __forceinline__
#else
#define TITAN_HD inline
#endif

namespace titan::model::philox {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;
constexpr uint32_t kMaxAttempts = 0xffff;

// FNV-1a 64 of `n` bytes.
inline uint64_t fqn_hash(const char* bytes, size_t n) {
  uint64_t h = kFnvOffset;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(bytes[i]);
    h *= kFnvPrime;
  }
  return h;
}

struct Words {
  uint32_t v[4];
};

// Philox-4x32-10 of counter (c0..c3) under key (k0, k1).
TITAN_HD Words philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                             uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Words{{c0, c1, c2, c3}};
}

TITAN_HD uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

TITAN_HD double bits_double(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// IEEE correctly rounded square root on both sides (sqrtsd; CUDA's double sqrt is __dsqrt_rn).
TITAN_HD double sqrt_rn(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// Natural log of a positive, normal x, with + - * / only: x = m * 2^e (m in [sqrt(1/2),
// sqrt(2)), exact bit manipulation), log m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172,
// summed to s^23 (next term < 1e-18 relative), e * ln2 in two parts (fdlibm's split: e * hi is
// exact). Accurate to a few ulp, and identical wherever IEEE float64 is.
TITAN_HD double log_positive(double x) {
  const uint64_t bits = double_bits(x);
  int64_t e = static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023;
  double m = bits_double((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    e += 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double series = 1.0 / 23.0;
  series = series * s2 + 1.0 / 21.0;
  series = series * s2 + 1.0 / 19.0;
  series = series * s2 + 1.0 / 17.0;
  series = series * s2 + 1.0 / 15.0;
  series = series * s2 + 1.0 / 13.0;
  series = series * s2 + 1.0 / 11.0;
  series = series * s2 + 1.0 / 9.0;
  series = series * s2 + 1.0 / 7.0;
  series = series * s2 + 1.0 / 5.0;
  series = series * s2 + 1.0 / 3.0;
  const double log_m = 2.0 * s + 2.0 * s * (s2 * series);
  const double ed = static_cast<double>(e);
  return ed * 6.93147180369123816490e-01 + (ed * 1.90821492927058770002e-10 + log_m);
}

// Phi^-1(p) for p in (0, 1): Wichura, Algorithm AS 241 (Appl. Statist. 37, 1988), PPND16.
TITAN_HD double normal_quantile(double p) {
  const double q = p - 0.5;
  if ((q < 0 ? -q : q) <= 0.425) {
    const double r = 0.180625 - q * q;
    const double num =
        (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r +
              6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r +
            1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r +
          1.3314166789178437745e+2) * r + 3.3871328727963666080e0);
    const double den =
        (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r +
              3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r +
            5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r +
          4.2313330701600911252e+1) * r + 1.0);
    return q * num / den;
  }
  double r = q < 0 ? p : 1.0 - p;
  r = sqrt_rn(-log_positive(r));
  double value;
  if (r <= 5.0) {
    r = r - 1.6;
    const double num =
        (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r +
              2.41780725177450611770e-1) * r + 1.27045825245236838258e0) * r +
            3.64784832476320460504e0) * r + 5.76949722146069140550e0) * r +
          4.63033784615654529590e0) * r + 1.42343711074968357734e0);
    const double den =
        (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r +
              1.51986665636164571966e-2) * r + 1.48103976427480074590e-1) * r +
            6.89767334985100004550e-1) * r + 1.67638483018380384940e0) * r +
          2.05319162663775882187e0) * r + 1.0);
    value = num / den;
  } else {
    r = r - 5.0;
    const double num =
        (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r +
              1.24266094738807843860e-3) * r + 2.65321895265761230930e-2) * r +
            2.96560571828504891230e-1) * r + 1.78482653991729133580e0) * r +
          5.46378491116411436990e0) * r + 6.65790464350110377720e0);
    const double den =
        (((((((2.04426310338993978564e-15 * r + 1.42151175831644588870e-7) * r +
              1.84631831751005468180e-5) * r + 7.86869131145613259100e-4) * r +
            1.48753612908506148525e-2) * r + 1.36929880922735805310e-1) * r +
          5.99832206555887937690e-1) * r + 1.0);
    value = num / den;
  }
  return q < 0 ? -value : value;
}

// The uniform of output words (hi, lo): (2b + 1) / 2^53 with b their top 52 bits.
TITAN_HD double uniform_of(uint32_t hi, uint32_t lo) {
  const uint64_t b = ((static_cast<uint64_t>(hi) << 32) | lo) >> 12;
  return static_cast<double>(2 * b + 1) * 0x1p-53;
}

// The initial value of element `index` of the parameter keyed `key` (fqn_hash): float(std * z),
// redrawn while outside [lo, hi] (pass +-infinity for an untruncated normal).
TITAN_HD float init_value(uint64_t seed, uint64_t key, uint64_t index, double std, double lo,
                          double hi) {
  const uint64_t block = index >> 1;
  const int word = static_cast<int>(index & 1) * 2;
  double v = 0.0;
  for (uint32_t attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const Words w = philox4x32_10(
        static_cast<uint32_t>(block),
        static_cast<uint32_t>((block >> 32) & 0xffff) | (attempt << 16),
        static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32),
        static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    v = std * normal_quantile(uniform_of(w.v[word], w.v[word + 1]));
    if (v >= lo && v <= hi) return static_cast<float>(v);
  }
  return static_cast<float>(v < lo ? lo : hi);
}

// Elements 2 * block and 2 * block + 1 from ONE Philox call (what init_value computes for
// each, for the price of one): the CPU filler's inner loop.
TITAN_HD void init_pair(uint64_t seed, uint64_t key, uint64_t block, double std, double lo,
                        double hi, float* even, float* odd) {
  const Words w = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>((block >> 32) & 0xffff),
                                static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32),
                                static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const double v0 = std * normal_quantile(uniform_of(w.v[0], w.v[1]));
  const double v1 = std * normal_quantile(uniform_of(w.v[2], w.v[3]));
  // A rejected first draw (rare) takes init_value's path, attempt 0 recomputed.
  *even = v0 >= lo && v0 <= hi ? static_cast<float>(v0) : init_value(seed, key, 2 * block, std, lo, hi);
  *odd = v1 >= lo && v1 <= hi ? static_cast<float>(v1) : init_value(seed, key, 2 * block + 1, std, lo, hi);
}

}  // namespace titan::model::philox
