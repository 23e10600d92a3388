#include "trainer/checkpoint/state.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "float8/float8_linear.h"
#include "float8/scaling.h"
#include "trainer/checkpoint/weights_check.h"

namespace titan::trainer::checkpoint {
namespace {

StateTensor region_tensor(const std::string& name, const at::Tensor& local, const parallel::ShardRegion& r) {
  return StateTensor{name, parallel::region_view(local.detach(), r), r.global_shape, r.offsets, r.owner};
}

void read_region(StateSource& source, const std::string& name, const at::Tensor& local,
                 const parallel::ShardRegion& r) {
  if (r.numel() == 0) return;  // this rank holds only padding of it
  source.read(name, r.global_shape, r.offsets, parallel::region_view(local.detach(), r));
}

// Names the holder's tensors must be exactly `expected`: ONE error lists every tensor the
// checkpoint has that this run lacks and every one it lacks (a checkpoint of another model).
void check_names(const StateSource& source, const std::vector<std::string>& expected, const std::string& what) {
  std::set<std::string> missing(expected.begin(), expected.end());
  std::vector<std::string> extra;
  for (const std::string& name : source.names())
    if (missing.erase(name) == 0) extra.push_back(name);
  if (extra.empty() && missing.empty()) return;
  auto list = [](auto begin, auto end, size_t n) {
    std::string s;
    size_t shown = 0;
    for (auto it = begin; it != end && shown < 20; ++it, ++shown) s += (shown ? ", '" : "'") + *it + "'";
    if (n > shown) s += " and " + std::to_string(n - shown) + " more";
    return s;
  };
  std::string msg = "the checkpoint does not match " + what + ": ";
  if (!extra.empty()) msg += std::to_string(extra.size()) + " tensor(s) this run lacks: " + list(extra.begin(), extra.end(), extra.size());
  if (!missing.empty())
    msg += std::string(extra.empty() ? "" : "; ") + std::to_string(missing.size()) + " missing from it: " +
           list(missing.begin(), missing.end(), missing.size());
  throw std::runtime_error(msg);
}

}  // namespace

StateDict ModelState::state_dict() {
  StateDict sd;
  const auto regions = model_.shard_regions();
  for (size_t i = 0; i < regions.size(); ++i) {
    StateTensor t = region_tensor(regions[i].fqn, model_.master_params()[i], regions[i]);
    if (save_dtype_ != at::kFloat) t.local = t.local.to(save_dtype_);
    sd.tensors.push_back(std::move(t));
  }
  // Persistent buffers (MoE layers' expert_bias), float32 whatever the save dtype: the
  // load-balancing state a resume must continue from.
  model_.model().visit_buffers([&](const std::string& fqn, at::Tensor& buffer) {
    sd.tensors.push_back(StateTensor{fqn, buffer.detach(), buffer.sizes().vec(),
                                     std::vector<int64_t>(static_cast<size_t>(buffer.dim()), 0), writes_buffers_});
  });
  return sd;
}

void ModelState::load_state_dict(StateSource& source) {
  at::NoGradGuard no_grad;
  const auto regions = model_.shard_regions();
  // Every parameter of the model (under pp this rank reads only its stages' regions) and buffer.
  std::vector<std::string> expected = model_.all_param_names();
  model_.model().visit_buffers([&](const std::string& fqn, at::Tensor&) { expected.push_back(fqn); });
  check_names(source, expected, "the model's parameters and buffers");
  model_.model().visit_buffers([&](const std::string& fqn, at::Tensor& buffer) {
    source.read(fqn, buffer.sizes().vec(), std::vector<int64_t>(static_cast<size_t>(buffer.dim()), 0), buffer);
    check_weight_values(buffer, "buffer '" + fqn + "'", false);
  });
  for (size_t i = 0; i < regions.size(); ++i) {
    read_region(source, regions[i].fqn, model_.master_params()[i], regions[i]);
    // This rank's region only: every rank checks its own, and the load's all-reduced error flag
    // stops them all (Note [Weights that cannot train] in trainer/checkpoint/weights_check.h).
    check_weight_values(parallel::region_view(model_.master_params()[i].detach(), regions[i]),
                        "parameter '" + regions[i].fqn + "' (this rank's region)");
  }
}

StateDict OptimizerState::state_dict() {
  StateDict sd;
  const auto regions = model_.shard_regions();
  nlohmann::json steps = nlohmann::json::object();
  for (size_t i = 0; i < regions.size(); ++i) {
    sd.tensors.push_back(region_tensor(regions[i].fqn + ".exp_avg", optimizer_.exp_avg(i), regions[i]));
    sd.tensors.push_back(region_tensor(regions[i].fqn + ".exp_avg_sq", optimizer_.exp_avg_sq(i), regions[i]));
    // A float32 count of steps: an integer, exact in JSON.
    steps[regions[i].fqn] = optimizer_.step_count(i).item<float>();
  }
  // The extras are rank 0's. Under pipeline parallelism it holds only its stages' parameters; every
  // parameter steps together (each has a gradient every step, a skipped step skips all), so the
  // others' counts are its own.
  if (!regions.empty())
    for (const std::string& fqn : model_.all_param_names())
      if (!steps.contains(fqn)) steps[fqn] = optimizer_.step_count(0).item<float>();
  sd.extras = {{"name", optimizer_.options().name}, {"steps", steps}};
  return sd;
}

void OptimizerState::load_state_dict(StateSource& source) {
  at::NoGradGuard no_grad;
  const auto regions = model_.shard_regions();
  const nlohmann::json& steps = source.extras().at("steps");
  for (size_t i = 0; i < regions.size(); ++i) {
    read_region(source, regions[i].fqn + ".exp_avg", optimizer_.exp_avg(i), regions[i]);
    read_region(source, regions[i].fqn + ".exp_avg_sq", optimizer_.exp_avg_sq(i), regions[i]);
    // AdamW's moments: NaN or Inf would make every later update non-finite. Their magnitude is
    // not bounded (exp_avg_sq holds squares), so only finiteness is checked.
    check_weight_values(parallel::region_view(optimizer_.exp_avg(i), regions[i]),
                        "optimizer state '" + regions[i].fqn + ".exp_avg' (this rank's region)", false);
    check_weight_values(parallel::region_view(optimizer_.exp_avg_sq(i), regions[i]),
                        "optimizer state '" + regions[i].fqn + ".exp_avg_sq' (this rank's region)", false);
    auto it = steps.find(regions[i].fqn);
    if (it == steps.end())
      throw std::runtime_error("optimizer state has no step count for parameter '" + regions[i].fqn + "'");
    optimizer_.step_count(i).fill_(it->get<double>());
  }
}

StateDict DataLoaderState::state_dict() {
  StateDict sd;
  sd.extras = nlohmann::json::parse(loader_.state_dict());
  return sd;
}

void DataLoaderState::load_state_dict(StateSource& source) {
  try {
    loader_.load_state_dict(source.extras().dump());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) +
                             "; or, to resume with the new value anyway, add --checkpoint.exclude_from_loading "
                             "dataloader (the data then continues at global batch <step> of the new shape)");
  }
}

namespace {
struct DelayedOperand {
  std::string name;  // "<linear fqn>.<input|weight|grad_output>"
  float8::AmaxHistory* history;
  at::ScalarType dtype;
  bool round_pow2;
  int64_t length;
};

std::vector<DelayedOperand> delayed_operands(model::Transformer& model) {
  std::vector<DelayedOperand> out;
  for (model::Linear* l : model.linears()) {
    auto* c = dynamic_cast<float8::Float8LinearCompute*>(model::innermost(l->compute()));
    if (!c || !c->recipe().delayed) continue;
    float8::Float8LinearState& s = c->state();
    const float8::Float8Recipe& r = s.recipe;
    const bool pow2 = r.round_scales_to_power_of_2;
    out.push_back({l->fqn() + ".input", &s.input, r.input.dtype, pow2, r.amax_history_len});
    out.push_back({l->fqn() + ".weight", &s.weight, r.weight.dtype, pow2, r.amax_history_len});
    out.push_back({l->fqn() + ".grad_output", &s.grad_output, r.grad_output.dtype, pow2, r.amax_history_len});
  }
  return out;
}
}  // namespace

StateDict Float8State::state_dict() {
  StateDict sd;
  nlohmann::json initialized = nlohmann::json::array();
  for (const DelayedOperand& o : delayed_operands(model_)) {
    if (!o.history->initialized) continue;
    initialized.push_back(o.name);
    // After each step's sync the pending amax is zero and the scale is a function of the
    // history, so the history is the whole state.
    sd.tensors.push_back(StateTensor{o.name + ".amax_history", o.history->history.detach(),
                                     {o.length}, {0}, writer_});
  }
  sd.extras = {{"delayed_initialized", initialized}};
  return sd;
}

void Float8State::load_state_dict(StateSource& source) {
  at::NoGradGuard no_grad;
  const nlohmann::json& extras = source.extras();
  const nlohmann::json initialized = extras.value("delayed_initialized", nlohmann::json::array());
  for (const DelayedOperand& o : delayed_operands(model_)) {
    if (std::find(initialized.begin(), initialized.end(), o.name) == initialized.end()) continue;
    float8::AmaxHistory& h = *o.history;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
    h.history = at::zeros({o.length}, f32);
    source.read(o.name + ".amax_history", {o.length}, {0}, h.history);
    h.amax = at::zeros({}, f32);
    // What sync_amax_history computed after the saved step, recomputed bit for bit.
    h.scale = float8::scale_from_amax(at::amax(h.history), o.dtype, o.round_pow2);
    h.initialized = true;
    h.synced = true;
  }
}

}  // namespace titan::trainer::checkpoint
