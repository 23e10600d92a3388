// model/scope.h — named scopes: who is running right now, for memory snapshots and profiles.
//
// A NamedScope pushes a name ("forward", "layers.3", "attention", "optimizer") onto a
// thread-local stack for its lifetime and, when a profiler is collecting, opens a user range
// of the same name (at::RecordFunction, USER_SCOPE), so Perfetto shows titan's structure. The
// CPU memory recorder (trainer/observe/memory.h) stamps every allocation with the current scope path
// and its category, which become the frames and the colors of a memory snapshot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace at {
class RecordFunction;
}

namespace titan::model {

// What an allocation is for, as the memory picture stacks it. kInherit keeps the parent's.
enum class MemoryCategory : uint8_t {
  kOther = 0,
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kFloat8Casts,
  kCommunication,
  kInherit,
};
constexpr int kNumMemoryCategories = 7;  // every category but kInherit
const char* memory_category_name(MemoryCategory c);  // "activations", ...

class NamedScope {
 public:
  explicit NamedScope(const std::string& name, MemoryCategory category = MemoryCategory::kInherit);
  ~NamedScope();
  NamedScope(const NamedScope&) = delete;
  NamedScope& operator=(const NamedScope&) = delete;

 private:
  std::unique_ptr<at::RecordFunction> range_;
};

// The current scope of this thread: an interned id of the whole path ("forward/layers.3/
// attention"), 0 = no scope, and its category. Called on every recorded allocation: the first
// call within a scope interns its path (Note [Scope paths on demand] in scope.cpp), later ones
// read it.
int32_t current_scope_path_id();
MemoryCategory current_memory_category();
// The path of an id, outermost first; empty for 0.
std::vector<std::string> scope_path(int32_t id);

}  // namespace titan::model
