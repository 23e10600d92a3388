// trainer/checkpoint/state.h — training state as an explicit interface (torchtitan's Stateful).
//
// Every holder of training state exposes it the same way: `state_dict()` returns named tensors
// (this rank's real elements of each, with where they lie in the global tensor) plus small JSON
// extras, and `load_state_dict()` reads them back from a StateSource, which serves any region of
// any global tensor whatever layout wrote it. The holders (state.cpp):
//   model       the float32 master parameters (this rank's TP/FSDP shards; Note [Checkpoint
//               shards] in parallel/parallel_model.h)
//   optimizer   AdamW exp_avg / exp_avg_sq (same layout as their parameter) and step counts
//   dataloader  the reader position (batches consumed) and what it is valid for
//   float8      tensorwise_delayed amax histories (scales are recomputed from them on load;
//               FSDP's precomputed float8 scales are recomputed by ParallelModel::after_load)
// The step number and the config live in the manifest (manager.h). The LR schedule is a
// pure function of the step; no random generator is consumed after initialization (the init
// RNG is seeded, the data order is a function of seed and epoch), so there is no RNG state.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/transformer.h"
#include "parallel/parallel_model.h"
#include "trainer/optim/optimizer.h"

namespace titan::trainer::checkpoint {

// One tensor of a state dict as this rank holds it.
struct StateTensor {
  std::string name;                   // relative to its holder: "layers.0.attention.wq.weight"
  at::Tensor local;                   // this rank's real elements (a view; any device)
  std::vector<int64_t> global_shape;  // the whole tensor over all ranks
  std::vector<int64_t> offsets;       // where `local` starts in it, per dim
  bool owner = true;                  // this rank writes it (each element has exactly one owner)
};

struct StateDict {
  std::vector<StateTensor> tensors;
  nlohmann::json extras = nlohmann::json::object();
};

// Where a load reads from: one holder's view of a checkpoint.
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual const nlohmann::json& extras() const = 0;
  virtual bool has(const std::string& name) const = 0;
  // Every tensor name the source holds (relative to the holder), sorted.
  virtual std::vector<std::string> names() const = 0;
  // Fills `dest` (any device and dtype, its shape is the region's extent) with the region of
  // tensor `name` starting at `offsets`; checks the saved global shape equals `global_shape`.
  // Errors name the checkpoint file and the tensor.
  virtual void read(const std::string& name, const std::vector<int64_t>& global_shape,
                    const std::vector<int64_t>& offsets, const at::Tensor& dest) = 0;
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual StateDict state_dict() = 0;
  virtual void load_state_dict(StateSource& source) = 0;
};

// The master parameters and the model's persistent buffers (model::Transformer::visit_buffers).
// `save_dtype`: float32, or bfloat16 for a weights-only export. `writes_buffers`: this rank
// writes the buffers (rank 0: they are identical on every rank, ParallelModel::balance_experts).
class ModelState final : public Stateful {
 public:
  ModelState(parallel::ParallelModel& model, at::ScalarType save_dtype = at::kFloat, bool writes_buffers = true)
      : model_(model), save_dtype_(save_dtype), writes_buffers_(writes_buffers) {}
  StateDict state_dict() override;
  void load_state_dict(StateSource& source) override;  // the caller then runs model.after_load()

 private:
  parallel::ParallelModel& model_;
  at::ScalarType save_dtype_;
  bool writes_buffers_;
};

class OptimizerState final : public Stateful {
 public:
  OptimizerState(optim::AdamW& optimizer, parallel::ParallelModel& model) : optimizer_(optimizer), model_(model) {}
  StateDict state_dict() override;
  void load_state_dict(StateSource& source) override;

 private:
  optim::AdamW& optimizer_;
  parallel::ParallelModel& model_;
};

class DataLoaderState final : public Stateful {
 public:
  explicit DataLoaderState(data::DataLoader& loader) : loader_(loader) {}
  StateDict state_dict() override;
  void load_state_dict(StateSource& source) override;

 private:
  data::DataLoader& loader_;
};

// Delayed-scaling amax histories of every tensorwise_delayed linear (identical on every rank
// after each step's sync, so rank `writer_rank` alone writes them).
class Float8State final : public Stateful {
 public:
  Float8State(model::Transformer& model, c10::Device device, bool writer)
      : model_(model), device_(device), writer_(writer) {}
  StateDict state_dict() override;
  void load_state_dict(StateSource& source) override;

 private:
  model::Transformer& model_;
  c10::Device device_;
  bool writer_;
};

}  // namespace titan::trainer::checkpoint
