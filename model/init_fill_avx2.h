// model/init_fill_avx2.h — the counter-based init's CPU inner loop, 4 float64 lanes at a time
// (AVX2, model/init_fill_avx2.cpp), and its scalar reference (init_fill.cpp). Both give the
// values of Note [Counter-based init] (model/init_philox.h) bit for bit; the AVX2 one only runs
// where util::cpu_has_avx2_kernels() and init_avx2_compiled() hold. Raw buffers, no LibTorch types:
// the AVX2 file is compiled with -mavx2 (Note [AVX2 kernel files] in the top CMakeLists.txt).
#pragma once

#include <cstdint>

namespace titan::model::philox {

// Full-tensor elements [first, first + n) of the parameter keyed `key` into out[0, n):
// float(std * z), redrawn while outside [lo, hi] (Note [Counter-based init]).
void fill_run_scalar(float* out, uint64_t first, int64_t n, uint64_t seed, uint64_t key, double std,
                     double lo, double hi);
void fill_run_avx2(float* out, uint64_t first, int64_t n, uint64_t seed, uint64_t key, double std,
                   double lo, double hi);

// normal_quantile of init_philox.h, compiled at the baseline ISA (the AVX2 file's far-tail
// fallback calls it rather than emitting init_philox.h's inline functions with AVX2 code).
double normal_quantile_scalar(double p);

// z[i] = normal_quantile(p[i]) for p in (0, 1), by the AVX2 path's quantile (tests reach its
// far tail, u < 1.4e-11, which no filler test draws).
void normal_quantile_avx2(const double* p, double* z, int64_t n);

// Whether fill_run_avx2 is the vector code (x86-64 builds); elsewhere it is fill_run_scalar.
bool init_avx2_compiled();

}  // namespace titan::model::philox
