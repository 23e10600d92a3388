// parallel/comm/comm_trace.h — the collective flight recorder: the last `capacity` collectives of
// this process (every group), kept in a ring buffer by Comm, written as JSON when a collective
// fails or times out, so that a hung job says which rank was behind and in which collective.
//
// Each entry: op, group, sequence number in that group, bytes, wall-clock issue time, and its
// state: "scheduled" (issued to the backend, not yet waited for), "started" (the caller is
// blocked in wait()), "completed", "timed-out" (wait() gave up after the group's timeout) or
// "failed" (any other error). Comparing the files of two ranks: the rank that stopped has a
// lower last sequence number in the group, and the others' entry of the next number is not
// completed (see docs/parallelism.md).
//
// File: {"rank", "reason", "capacity", "entries": [...oldest first], "groups": {name:
// {"last_issued", "last_completed"}}}. Written with util/atomic_file.h, never half.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace titan::parallel::comm {

enum class CollectiveState { kScheduled, kStarted, kCompleted, kTimedOut, kFailed };
const char* collective_state_name(CollectiveState state);  // "scheduled", ..., "timed-out"

struct CollectiveTraceEntry {
  uint64_t id = 0;  // 1, 2, ... over the process; slot = id % capacity
  std::string group;
  uint64_t seq = 0;
  std::string op;
  int64_t bytes = 0;
  double issued_unix_s = 0;     // wall clock, comparable across the ranks of one host
  double finished_unix_s = -1;  // completed / failed; -1 while in flight
  CollectiveState state = CollectiveState::kScheduled;
};

class CommTrace {
 public:
  // capacity 0 turns recording off (every call below is then a no-op that returns 0).
  // `dump_path`: where dump() writes; empty = nowhere (the error still names the states).
  void configure(size_t capacity, std::string dump_path, int rank);
  size_t capacity() const;

  uint64_t on_issue(const std::string& group, uint64_t seq, const std::string& op, int64_t bytes);
  void on_state(uint64_t id, CollectiveState state);

  // The entries still in the buffer, oldest first.
  std::vector<CollectiveTraceEntry> entries() const;
  std::string to_json(const std::string& reason) const;
  // Writes to_json(reason) to the configured path; returns the path, or "" when there is none
  // or writing failed (then `*error` says why). Never throws: it runs on the error path.
  std::string dump(const std::string& reason, std::string* error = nullptr) const;

 private:
  mutable std::mutex mutex_;
  std::vector<CollectiveTraceEntry> ring_;
  uint64_t next_id_ = 1;
  std::string dump_path_;
  int rank_ = 0;
};

// The process's recorder (all Comms of a rank share it: one file per rank).
CommTrace& comm_trace();

}  // namespace titan::parallel::comm
