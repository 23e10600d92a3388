// util/edit_distance.h — Levenshtein distance for "did you mean ...?" suggestions.
//
// Header-only and free of LibTorch: titan-run's flag parser (launcher/launch_options.cpp, built
// without LibTorch) and the config key table (trainer/config/job_config.cpp) share it.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace titan::util {

// Insertions, deletions and substitutions (each cost 1) turning `a` into `b`.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // row[j - 1] of the previous row
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace titan::util
