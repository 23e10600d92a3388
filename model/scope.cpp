#include "model/scope.h"

#include <ATen/record_function.h>

#include <mutex>
#include <unordered_map>

namespace titan::model {
namespace {

// Note [Scope paths on demand]: a scope costs a copy of its name into this thread's stack and
// nothing else. Only a memory recorder asks for the path's id (current_scope_path_id, on each
// recorded allocation), and only then is the path interned, under the interner's lock, once per
// open frame; without a recorder nothing is interned and no lock is taken, whatever the number of
// scopes (a collective opens two). The frames' strings keep their capacity between scopes, so a
// steady step allocates nothing here.
constexpr int32_t kNotInterned = -1;
struct Frame {
  std::string name;
  int32_t path_id = kNotInterned;
  MemoryCategory category = MemoryCategory::kOther;
};
thread_local std::vector<Frame> t_frames;  // [0, t_depth) are open; the rest keep their capacity
thread_local size_t t_depth = 0;

// Interned scope paths: (parent id, name) -> id. Scopes are few (blocks x a handful), so a
// mutex-guarded map is fine.
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
  const MemoryCategory parent = t_depth == 0 ? MemoryCategory::kOther : t_frames[t_depth - 1].category;
  if (t_depth == t_frames.size()) t_frames.emplace_back();
  Frame& frame = t_frames[t_depth++];
  frame.name.assign(name);
  frame.path_id = kNotInterned;
  frame.category = category == MemoryCategory::kInherit ? parent : category;
  if (at::hasCallbacks()) {
    range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (range_->isActive()) range_->before(name);
  }
}

NamedScope::~NamedScope() {
  range_.reset();  // closes the profiler range before the scope is popped
  --t_depth;
}

int32_t current_scope_path_id() {
  if (t_depth == 0) return 0;
  // See Note [Scope paths on demand]: intern the open frames not interned yet, outermost first.
  size_t first = t_depth;
  while (first > 0 && t_frames[first - 1].path_id == kNotInterned) --first;
  for (size_t i = first; i < t_depth; ++i)
    t_frames[i].path_id = intern(i == 0 ? 0 : t_frames[i - 1].path_id, t_frames[i].name);
  return t_frames[t_depth - 1].path_id;
}

MemoryCategory current_memory_category() { return t_depth == 0 ? MemoryCategory::kOther : t_frames[t_depth - 1].category; }

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
