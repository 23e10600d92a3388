#include "trainer/checkpoint/weights_check.h"

#include <ATen/ops/abs.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_and.h>

#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/safetensors.h"

namespace titan::trainer::checkpoint {
namespace {

constexpr double kHugeWeight = 18446744073709551616.0;  // 2^64: Note [Weights that cannot train]
constexpr size_t kNamesShown = 20;                      // a long list is cut, with its count

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kNamesShown) s += " and " + std::to_string(names.size() - kNamesShown) + " more";
  return s;
}

}  // namespace

std::string WeightValueCounts::describe() const {
  std::string s;
  auto add = [&](int64_t n, const char* what) {
    if (n > 0) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + what;
  };
  add(nan, "NaN");
  add(inf, "Inf");
  add(huge, "finite value(s) with |x| >= 2^64 (~1.8e19)");
  return s;
}

WeightValueCounts count_bad_weight_values(const at::Tensor& t, bool check_magnitude) {
  WeightValueCounts c;
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return c;
  c.nan = at::isnan(t).sum().item<int64_t>();
  c.inf = at::isinf(t).sum().item<int64_t>();
  if (check_magnitude) c.huge = at::logical_and(at::isfinite(t), at::abs(t) >= kHugeWeight).sum().item<int64_t>();
  return c;
}

void check_weight_values(const at::Tensor& t, const std::string& what, bool check_magnitude) {
  const WeightValueCounts c = count_bad_weight_values(t, check_magnitude);
  if (c.ok()) return;
  throw std::runtime_error(what + " holds " + c.describe() + " of its " + std::to_string(t.numel()) +
                           " values: training from it is non-finite from the first step (its square overflows "
                           "float32); use another checkpoint");
}

std::vector<std::string> load_weights_file(const std::string& path, const model::ModelArgs& args,
                                           const std::vector<std::string>& fqns,
                                           const std::function<void(const std::string&, const at::Tensor&)>& load,
                                           const std::vector<std::string>& buffers) {
  const bool hf = is_hf_checkpoint(path);
  const std::string where = "checkpoint.initial_load_path '" + path + "'";
  // Names first, in the file's spelling: what the model's parameters are called there (a
  // stacked expert weight is E HF tensors), against what the file holds.
  std::set<std::string> missing;
  for (const std::string& fqn : fqns)
    if (hf) {
      for (const std::string& name : hf_names(fqn, args)) missing.insert(name);
    } else {
      missing.insert(fqn);
    }
  // The buffers the file may hold, by their name there; a buffer the format has no tensor for is
  // absent by construction.
  std::map<std::string, std::string> optional;  // file's name -> buffer fqn
  for (const std::string& fqn : buffers)
    if (const std::optional<std::string> name = hf ? hf_buffer_name(fqn, args) : std::optional<std::string>(fqn))
      optional[*name] = fqn;
  std::set<std::string> absent_buffers(buffers.begin(), buffers.end());
  auto is_buffer = [&](const std::string& name) {
    const auto it = optional.find(name);
    if (it == optional.end()) return false;
    absent_buffers.erase(it->second);
    return true;
  };
  std::vector<std::string> unexpected;
  std::map<std::string, SafetensorsEntry> entries;  // the titan safetensors file's
  if (hf) {
    for (const auto& [file, names] : hf_checkpoint_files(path))
      for (const std::string& name : names) {
        if (missing.erase(name) > 0 || is_buffer(name)) continue;
        bool ignored = false;  // a rotary buffer or a tied lm_head titan has no parameter for
        try {
          ignored = titan_slot_from_hf(name, args).fqn.empty();
        } catch (const std::invalid_argument&) {  // a name titan does not know: unexpected
        }
        if (!ignored) unexpected.push_back(name);
      }
  } else {
    entries = read_safetensors_header(path);
    for (const auto& [name, entry] : entries)
      if (missing.erase(name) == 0 && !is_buffer(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty() || !missing.empty()) {
    const std::vector<std::string> absent(missing.begin(), missing.end());
    std::string msg = where + " does not match the model (flavor and vocabulary size): ";
    if (!unexpected.empty())
      msg += std::to_string(unexpected.size()) + " tensor(s) the model lacks: " + name_list(unexpected);
    if (!absent.empty())
      msg += std::string(unexpected.empty() ? "" : "; ") + std::to_string(absent.size()) +
             " parameter(s) missing from it: " + name_list(absent);
    throw std::runtime_error(msg);
  }
  // A tensor as the file names it; a stacked expert weight by its first and last expert's names.
  auto file_name = [&](const std::string& fqn) {
    if (!hf) return "'" + fqn + "'";
    const std::vector<std::string> names = hf_names(fqn, args);
    return names.size() == 1 ? "'" + names[0] + "'" : "'" + names.front() + "' .. '" + names.back() + "'";
  };
  auto load_checked = [&](const std::string& fqn, const at::Tensor& full) {
    check_weight_values(full, where + ": tensor " + file_name(fqn));
    try {
      load(fqn, full);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
  };
  if (hf) {
    read_hf_checkpoint(path, args, load_checked);  // one tensor at a time
  } else {
    for (const auto& [name, tensor] : load_safetensors(path)) load_checked(name, tensor);
  }
  return {absent_buffers.begin(), absent_buffers.end()};
}

}  // namespace titan::trainer::checkpoint
