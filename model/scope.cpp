#include "model/scope.h"

#include <ATen/record_function.h>

#include <mutex>
#include <unordered_map>

namespace titan::model {
namespace {

struct Frame {
  int32_t path_id;
  MemoryCategory category;
};
thread_local std::vector<Frame> t_stack;

// Interned scope paths: (parent id, name) -> id. Scopes are few (blocks x a handful), so a
// mutex-guarded map is fine; allocation recording only reads the thread-local top.
struct Interner {
  std::mutex mu;
  std::unordered_map<std::string, int32_t> ids;   // "parent_id/name" -> id
  std::vector<std::pair<int32_t, std::string>> nodes{{0, ""}};  // id -> (parent, name)
};
Interner& interner() {
  static auto* in = new Interner();  // outlives static destruction (allocations at exit)
  return *in;
}

int32_t intern(int32_t parent, const std::string& name) {
  Interner& in = interner();
  std::lock_guard<std::mutex> lock(in.mu);
  std::string key = std::to_string(parent) + "/" + name;
  auto it = in.ids.find(key);
  if (it != in.ids.end()) return it->second;
  const auto id = static_cast<int32_t>(in.nodes.size());
  in.nodes.emplace_back(parent, name);
  in.ids.emplace(std::move(key), id);
  return id;
}

}  // namespace

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kOptimizerState: return "optimizer state";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kFloat8Casts: return "float8 casts";
    case MemoryCategory::kCommunication: return "communication buffers";
    default: return "other";
  }
}

NamedScope::NamedScope(const std::string& name, MemoryCategory category) {
  const Frame parent = t_stack.empty() ? Frame{0, MemoryCategory::kOther} : t_stack.back();
  t_stack.push_back({intern(parent.path_id, name),
                     category == MemoryCategory::kInherit ? parent.category : category});
  if (at::hasCallbacks()) {
    range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (range_->isActive()) range_->before(name);
  }
}

NamedScope::~NamedScope() {
  range_.reset();  // closes the profiler range before the scope is popped
  t_stack.pop_back();
}

int32_t current_scope_path_id() { return t_stack.empty() ? 0 : t_stack.back().path_id; }
MemoryCategory current_memory_category() {
  return t_stack.empty() ? MemoryCategory::kOther : t_stack.back().category;
}

std::vector<std::string> scope_path(int32_t id) {
  Interner& in = interner();
  std::lock_guard<std::mutex> lock(in.mu);
  std::vector<std::string> out;
  while (id > 0 && id < static_cast<int32_t>(in.nodes.size())) {
    out.insert(out.begin(), in.nodes[id].second);
    id = in.nodes[id].first;
  }
  return out;
}

}  // namespace titan::model
