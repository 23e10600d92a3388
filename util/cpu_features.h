// util/cpu_features.h — what the CPU titan runs on can do, for the kernels compiled for more than
// the baseline ISA.
#pragma once

namespace titan::util {

// Whether this CPU runs the AVX2 kernel files (Note [AVX2 kernel files] in CMakeLists.txt): true
// off x86 (generic kernels), on x86 only with AVX2 + FMA. Every caller of a CPU kernel of
// model/kernels, float8/kernels or trainer/optim's AdamW kernel checks it first.
inline bool cpu_has_avx2_kernels() {
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return true;
#endif
}

}  // namespace titan::util
