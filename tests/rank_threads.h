// tests/rank_threads.h — the ranks of one Gloo job as threads of the test process.
//
// Each thread is a rank with its own TCPStore client (rank 0 hosts the store on a free port of
// 127.0.0.1 and tells the others through a future). Unit tests of collectives, FSDP and TP use
// it where starting processes would only add seconds.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/process_group.h"

namespace titan::testing {

// Runs body(rank, store) on `world` threads; returns one error text per rank ("" = passed).
inline std::vector<std::string> run_ranks_on_threads(
    int world, std::chrono::milliseconds timeout,
    const std::function<void(int rank, const c10::intrusive_ptr<c10d::Store>& store)>& body) {
  titan::parallel::comm::issue_under_process_lock();  // ranks as threads: Note [Issuing under one lock]
  std::promise<int> port_promise;
  std::shared_future<int> port = port_promise.get_future().share();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        c10::intrusive_ptr<c10d::Store> store;
        if (rank == 0) {
          try {
            store = titan::parallel::comm::create_tcp_store("127.0.0.1", 0, 0, world, timeout);
            port_promise.set_value(titan::parallel::comm::store_port(store));
          } catch (...) {
            port_promise.set_exception(std::current_exception());  // the others fail, not hang
            throw;
          }
        } else {
          store = titan::parallel::comm::create_tcp_store("127.0.0.1", port.get(), rank, world, timeout);
        }
        body(rank, store);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace titan::testing
