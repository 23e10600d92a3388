// model/sharding_plan.h — how a model's modules split under tensor parallelism, as plain data:
// what a family's modules declare (model/family.h) and parallel/ interprets (parallel/parallelize.h).
// The model never runs a collective; a rule only says which weight dimension is sharded and
// where a module's input is gathered. Names are full module paths ("layers.3.attention.wq").
//
// Note [A plan as data]: torchtitan writes one parallelize_<family> per family, code that calls
// the parallel library (ColwiseParallel, PrepareModuleInput, ...). titan's families write the
// same plan as rules here, so a new family adds rows, not a parallelization function, and one
// interpreter (parallel/parallelize.cpp) applies every family's rules the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan::model {

enum class TpStyle {
  kColwise,          // a Linear: weight rows sharded; input replicated; output sharded on features
  kRowwise,          // a Linear: weight columns sharded; output reduce-scattered to sequence shards
  kRowwisePartial,   // a Linear: weight columns sharded; output left partial (the module reduces it)
  kReplicated,       // a weight every rank holds whole (norms on sequence shards, replicated
                     // projections); its gradient is summed over the TP group
  kGatherInput,      // a module whose sequence-sharded input is all-gathered once for `readers`
  kGatherInputReduceOutput,  // an MoE layer on the whole sequence: input gathered, its partial
                             // output reduce-scattered back to sequence shards
  kShardTensor,      // a stacked tensor (an MoE layer's experts) sharded along `dim`
  kVocabParallelEmbedding,   // the token embedding: vocabulary rows sharded, output sequence-sharded
  kVocabParallelOutput,      // the output projection: vocabulary rows sharded
};

struct TpRule {
  std::string module;  // full path; kShardTensor: the tensor's own name ("layers.3.moe.experts.w1")
  TpStyle style;
  // kGatherInput: the linears that read the gathered input (full paths). The gather may carry
  // float8 data only when every reader takes the same float8 input.
  std::vector<std::string> readers = {};
  int64_t dim = -1;  // kShardTensor: the sharded dimension
  // True for the rules of an MoE layer whose experts are sharded on their hidden dimension; a
  // layout that runs expert parallelism over the TP ranks instead (EP without ETP) skips them.
  bool experts_sharded = false;
};

// A size that a tensor-parallel degree must divide, and how an error names it: {"the number of
// attention heads n_heads", 32}.
struct ShardedSize {
  std::string what;
  int64_t value;
};

}  // namespace titan::model
