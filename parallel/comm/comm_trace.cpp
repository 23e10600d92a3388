// parallel/comm/comm_trace.cpp — see comm_trace.h.
#include "parallel/comm/comm_trace.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "util/atomic_file.h"

namespace titan::parallel::comm {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* collective_state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::kScheduled: return "scheduled";
    case CollectiveState::kStarted: return "started";
    case CollectiveState::kCompleted: return "completed";
    case CollectiveState::kTimedOut: return "timed-out";
    case CollectiveState::kFailed: return "failed";
  }
  return "unknown";
}

void CommTrace::configure(size_t capacity, std::string dump_path, int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.assign(capacity, CollectiveTraceEntry{});
  next_id_ = 1;
  dump_path_ = std::move(dump_path);
  rank_ = rank;
}

size_t CommTrace::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

uint64_t CommTrace::on_issue(const std::string& group, uint64_t seq, const std::string& op, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.empty()) return 0;
  const uint64_t id = next_id_++;
  CollectiveTraceEntry& e = ring_[id % ring_.size()];
  e.id = id;
  e.group = group;
  e.seq = seq;
  e.op = op;
  e.bytes = bytes;
  e.issued_unix_s = unix_seconds();
  e.finished_unix_s = -1;
  e.state = CollectiveState::kScheduled;
  return id;
}

void CommTrace::on_state(uint64_t id, CollectiveState state) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id == 0 || ring_.empty()) return;
  CollectiveTraceEntry& e = ring_[id % ring_.size()];
  if (e.id != id) return;  // already overwritten by a newer collective
  e.state = state;
  if (state != CollectiveState::kScheduled && state != CollectiveState::kStarted) e.finished_unix_s = unix_seconds();
}

std::vector<CollectiveTraceEntry> CommTrace::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveTraceEntry> out;
  if (ring_.empty()) return out;
  const uint64_t last = next_id_ - 1;
  const uint64_t first = last >= ring_.size() ? last - ring_.size() + 1 : 1;
  for (uint64_t id = first; id <= last; ++id) out.push_back(ring_[id % ring_.size()]);
  return out;
}

std::string CommTrace::to_json(const std::string& reason) const {
  nlohmann::json entries = nlohmann::json::array();
  std::map<std::string, std::pair<uint64_t, uint64_t>> groups;  // last issued, last completed
  for (const CollectiveTraceEntry& e : this->entries()) {
    nlohmann::json j = {{"id", e.id},       {"group", e.group},     {"seq", e.seq},
                        {"op", e.op},       {"bytes", e.bytes},     {"issued_unix_s", e.issued_unix_s},
                        {"state", collective_state_name(e.state)}};
    if (e.finished_unix_s >= 0) j["finished_unix_s"] = e.finished_unix_s;
    entries.push_back(std::move(j));
    auto& g = groups[e.group];
    g.first = std::max(g.first, e.seq);
    if (e.state == CollectiveState::kCompleted) g.second = std::max(g.second, e.seq);
  }
  nlohmann::json group_summary = nlohmann::json::object();
  for (const auto& [name, g] : groups) group_summary[name] = {{"last_issued", g.first}, {"last_completed", g.second}};
  std::lock_guard<std::mutex> lock(mutex_);
  const nlohmann::json doc = {{"rank", rank_},          {"reason", reason},
                              {"capacity", ring_.size()}, {"groups", group_summary},
                              {"entries", entries}};
  return doc.dump(1) + "\n";
}

std::string CommTrace::dump(const std::string& reason, std::string* error) const {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dump_path_.empty() || ring_.empty()) return "";
    path = dump_path_;
  }
  try {
    const std::string text = to_json(reason);
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    util::write_file_atomic(path, text);
    return path;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return "";
  }
}

CommTrace& comm_trace() {
  static CommTrace trace;
  return trace;
}

}  // namespace titan::parallel::comm
