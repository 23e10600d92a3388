// trainer/config/agreement.cpp — see trainer/config/agreement.h.
#include "trainer/config/agreement.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstring>

#ifndef TITAN_SOURCE_COMMIT
#define TITAN_SOURCE_COMMIT "unknown"
#endif

namespace titan::trainer::config {
namespace {

// FNV-1a, 64 bit: stable across processes and builds (std::hash is not), cheap, and a
// disagreement it misses needs a 2^-64 collision.
uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A value travels in a fixed-size slot so that every rank's all-gather has the same size.
constexpr size_t kValueSlotBytes = 256;

// All-gathers `mine` (int64, same length on every rank) -> [size][mine.size()].
std::vector<std::vector<int64_t>> all_gather_int64(parallel::comm::Comm& world, std::vector<int64_t> mine,
                                                   const c10::Device& device) {
  const auto n = static_cast<int64_t>(mine.size());
  const at::Tensor input =
      at::from_blob(mine.data(), {n}, at::TensorOptions().dtype(at::kLong)).to(device);
  at::Tensor output = at::empty({world.size() * n}, input.options());
  world.all_gather_into_tensor(output, input);
  const at::Tensor host = output.to(at::kCPU).contiguous();
  const int64_t* p = host.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) out[static_cast<size_t>(r)].assign(p + r * n, p + (r + 1) * n);
  return out;
}

std::vector<std::string> all_gather_text(parallel::comm::Comm& world, const std::string& text,
                                         const c10::Device& device) {
  std::vector<uint8_t> slot(kValueSlotBytes, 0);
  std::string shown = text.size() < kValueSlotBytes ? text : text.substr(0, kValueSlotBytes - 4) + "...";
  std::memcpy(slot.data(), shown.data(), shown.size());
  const at::Tensor input =
      at::from_blob(slot.data(), {static_cast<int64_t>(kValueSlotBytes)}, at::TensorOptions().dtype(at::kByte))
          .to(device);
  at::Tensor output = at::empty({world.size() * static_cast<int64_t>(kValueSlotBytes)}, input.options());
  world.all_gather_into_tensor(output, input);
  const at::Tensor host = output.to(at::kCPU).contiguous();
  const auto* p = reinterpret_cast<const char*>(host.data_ptr<uint8_t>());
  std::vector<std::string> values;
  for (int r = 0; r < world.size(); ++r) {
    const char* begin = p + static_cast<size_t>(r) * kValueSlotBytes;
    values.emplace_back(begin, strnlen(begin, kValueSlotBytes));
  }
  return values;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> agreement_entries(const JobConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> entries = {{"titan.build", TITAN_SOURCE_COMMIT}};
  for (auto& e : config_entries_for_agreement(cfg)) entries.push_back(std::move(e));
  return entries;
}

std::string describe_disagreement(const std::string& key, const std::vector<std::string>& values,
                                  int other_keys_differing) {
  // Groups of ranks holding one value, in order of their lowest rank (rank 0's value first).
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < values.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == values[r]; });
    if (it == groups.end()) groups.push_back({values[r], {static_cast<int>(r)}});
    else it->second.push_back(static_cast<int>(r));
  }
  std::string msg = "config differs across ranks: " + key + " is ";
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) msg += g + 1 == groups.size() ? " but " : ", ";
    msg += groups[g].first + " on " + rank_list(groups[g].second);
  }
  if (other_keys_differing > 0) {
    msg += " (and " + std::to_string(other_keys_differing) + " more key" +
           (other_keys_differing > 1 ? "s differ" : " differs") + ")";
  }
  return msg + "; every rank must be started with the same config and overrides";
}

void check_config_agreement(parallel::comm::Comm& world, const JobConfig& cfg, const c10::Device& device) {
  const auto entries = agreement_entries(cfg);
  uint64_t whole = 1469598103934665603ull;
  std::vector<int64_t> per_key;
  for (const auto& [key, value] : entries) {
    const std::string line = key + "=" + value + "\n";
    whole = fnv1a(line, whole);
    per_key.push_back(static_cast<int64_t>(fnv1a(line)));
  }
  const auto n = static_cast<int64_t>(entries.size());
  const auto summaries = all_gather_int64(world, {static_cast<int64_t>(whole), n}, device);
  if (std::all_of(summaries.begin(), summaries.end(), [&](const auto& s) { return s == summaries[0]; })) return;

  // Every rank takes the same branches below, from the same gathered data, so the collectives
  // stay matched.
  for (const auto& s : summaries) {
    if (s[1] != n) {
      std::vector<std::string> counts;
      for (const auto& t : summaries) counts.push_back(std::to_string(t[1]) + " keys");
      throw ConfigError(describe_disagreement("the config schema", counts, 0) +
                        " (different titan builds)");
    }
  }
  const auto hashes = all_gather_int64(world, per_key, device);
  int first = -1, differing = 0;
  for (int64_t k = 0; k < n; ++k) {
    const bool same = std::all_of(hashes.begin(), hashes.end(),
                                  [&](const auto& h) { return h[static_cast<size_t>(k)] == hashes[0][static_cast<size_t>(k)]; });
    if (same) continue;
    if (first < 0) first = static_cast<int>(k);
    ++differing;
  }
  if (first < 0) {  // a whole-config hash collision on equal keys cannot happen; be explicit
    throw ConfigError("config differs across ranks, but no single key does (hash collision?)");
  }
  const auto& [key, value] = entries[static_cast<size_t>(first)];
  throw ConfigError(describe_disagreement(key, all_gather_text(world, value, device), differing - 1));
}

}  // namespace titan::trainer::config
