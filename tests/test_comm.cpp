// Comm (Gloo over a TCPStore on 127.0.0.1) with ranks as threads of one process, as PyTorch's
// own C++ c10d tests do: each thread holds its own store connection; rank 0's thread serves the
// store on a free port and hands the port to the others. Every collective is checked against a
// closed form, in float32 and bfloat16 (all values are small integers, exact in bf16).
//
// Catch2's assertions are not thread-safe, so rank threads throw on a mismatch and the main
// thread reports each rank's error.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <thread>

#include "launcher/world.h"
#include "parallel/comm/comm_trace.h"
#include "parallel/comm/process_group.h"
#include "tests/rank_threads.h"

using titan::parallel::comm::CollectiveRecord;
using titan::parallel::comm::CollectiveState;
using titan::parallel::comm::comm_trace;
using titan::parallel::comm::collective_state_name;
using titan::parallel::comm::Comm;
using titan::parallel::comm::CommError;
using titan::parallel::comm::CommOptions;
using titan::parallel::comm::ReduceOp;

namespace {

constexpr std::chrono::milliseconds kTestTimeout{20000};  // a hang fails instead of blocking CI

// Runs body(world_comm) on `world` threads; returns one error text per failed rank.
std::vector<std::string> run_ranks(int world, const std::function<void(Comm&)>& body,
                                   CommOptions options = {}) {
  if (options.timeout == CommOptions{}.timeout) options.timeout = kTestTimeout;
  const auto errors = titan::testing::run_ranks_on_threads(
      world, options.timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        Comm comm(store, rank, world, "world", options);
        body(comm);
      });
  std::vector<std::string> failed;
  for (int rank = 0; rank < world; ++rank) {
    if (!errors[static_cast<size_t>(rank)].empty()) {
      failed.push_back("rank " + std::to_string(rank) + ": " + errors[static_cast<size_t>(rank)]);
    }
  }
  return failed;
}

void require_all_ok(const std::vector<std::string>& errors) {
  for (const auto& e : errors) FAIL_CHECK(e);
  REQUIRE(errors.empty());
}

// Exact comparison (all test values are small integers); throws with both tensors.
void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  const Comm& comm) {
  at::Tensor g = got.to(at::kFloat);
  at::Tensor w = want.to(at::kFloat);
  if (g.sizes() != w.sizes() || !at::equal(g, w)) {
    std::ostringstream os;
    os << what << " on rank " << comm.global_rank() << " of group '" << comm.name()
       << "' (dtype " << got.scalar_type() << "):\n got  " << g.flatten() << "\n want "
       << w.flatten();
    throw std::runtime_error(os.str());
  }
}

void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

at::Tensor arange(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

// Every collective of Comm against its closed form; rank r contributes values built from r+1.
void check_collectives(Comm& comm, at::ScalarType dtype) {
  const int64_t n = 8;
  const int64_t w = comm.size();
  const int64_t r = comm.rank();
  uint64_t seq = comm.sequence_number();

  // all_reduce(sum): sum_r (r + 1 + i) = w(w+1)/2 + w*i
  at::Tensor t = arange(n, dtype) + static_cast<double>(r + 1);
  comm.all_reduce(t, ReduceOp::kSum);
  expect_equal(t, arange(n, dtype) * static_cast<double>(w) + static_cast<double>(w * (w + 1) / 2),
               "all_reduce(sum)", comm);
  expect(comm.sequence_number() == seq + 1, "sequence number did not advance on all_reduce");
  const CollectiveRecord& rec = comm.last_collective();
  expect(rec.op == "all_reduce(sum)" && rec.group == comm.name() &&
             rec.bytes == n * static_cast<int64_t>(at::elementSize(dtype)),
         "bad record after all_reduce: op " + rec.op + ", bytes " + std::to_string(rec.bytes));

  // all_reduce(max): max_r (r + 1 - i) = w - i, on a 2-D tensor
  at::Tensor m = (static_cast<double>(r + 1) - arange(n, dtype)).reshape({2, n / 2});
  comm.all_reduce(m, ReduceOp::kMax);
  expect_equal(m, (static_cast<double>(w) - arange(n, dtype)).reshape({2, n / 2}),
               "all_reduce(max)", comm);

  // all_gather_into_tensor: output[s*n + i] = 10*s + i, gathered [n/2, 2] blocks into [w*n/2, 2]
  at::Tensor in = (arange(n, dtype) + static_cast<double>(10 * r)).reshape({n / 2, 2});
  at::Tensor out = at::empty({w * n / 2, 2}, in.options());
  comm.all_gather_into_tensor(out, in);
  at::Tensor want_gather = at::empty({w, n}, at::kFloat);
  for (int64_t s = 0; s < w; ++s) want_gather[s] = arange(n, at::kFloat) + static_cast<double>(10 * s);
  expect_equal(out, want_gather.reshape({w * n / 2, 2}), "all_gather_into_tensor", comm);
  expect(comm.last_collective().op == "all_gather_into_tensor", "bad op name for all_gather");

  // reduce_scatter_tensor: input_r[j] = (r+1)*(j+1) over w*n/2 elements; rank r gets chunk r
  // of sum_r = w(w+1)/2 * (j+1)
  const int64_t chunk = n / 2;
  at::Tensor rs_in = (arange(w * chunk, dtype) + 1.0) * static_cast<double>(r + 1);
  at::Tensor rs_out = at::empty({chunk}, rs_in.options());
  comm.reduce_scatter_tensor(rs_out, rs_in);
  at::Tensor want_rs =
      (arange(chunk, at::kFloat) + static_cast<double>(r * chunk + 1)) * static_cast<double>(w * (w + 1) / 2);
  expect_equal(rs_out, want_rs, "reduce_scatter_tensor(sum)", comm);

  // broadcast from the last rank: everyone ends with (w-1)*100... kept small: (w-1) + i
  at::Tensor b = arange(n, dtype) + static_cast<double>(r);
  comm.broadcast(b, static_cast<int>(w - 1));
  expect_equal(b, arange(n, dtype) + static_cast<double>(w - 1), "broadcast", comm);

  comm.barrier();
  expect(comm.sequence_number() == seq + 6,
         "expected 6 collectives recorded, got " + std::to_string(comm.sequence_number() - seq));
  expect(comm.last_collective().op == "barrier", "last op should be barrier");
}

}  // namespace

TEST_CASE("Comm collectives match closed forms (Gloo, ranks as threads)", "[comm]") {
  for (int world : {2, 4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      INFO("world " << world << ", dtype " << dtype);
      require_all_ok(run_ranks(world, [&](Comm& comm) { check_collectives(comm, dtype); }));
    }
  }
}

TEST_CASE("Comm sub-groups over a PrefixStore: two groups of 2 in a world of 4", "[comm]") {
  require_all_ok(run_ranks(4, [](Comm& world) {
    const int r = world.rank();
    // "tp": {0,1} and {2,3}; "dp": {0,2} and {1,3} — every rank is in one of each.
    std::unique_ptr<Comm> tp = r < 2 ? world.new_group({0, 1}, "tp0") : world.new_group({2, 3}, "tp1");
    std::unique_ptr<Comm> dp = r % 2 == 0 ? world.new_group({0, 2}, "dp0") : world.new_group({1, 3}, "dp1");
    expect(tp && dp, "member got no sub-group");
    expect(world.new_group({(r + 1) % 4}, "solo" + std::to_string((r + 1) % 4)) == nullptr,
           "non-member should get nullptr");
    expect(tp->size() == 2 && tp->rank() == r % 2 && tp->global_rank() == r,
           "tp rank numbering: group rank " + std::to_string(tp->rank()) + ", global " +
               std::to_string(tp->global_rank()));
    expect(dp->rank() == r / 2 && dp->global_rank() == r, "dp rank numbering");

    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      // Sums of global rank + 1 within each group.
      at::Tensor t = at::full({3}, static_cast<double>(r + 1), at::TensorOptions().dtype(dtype));
      tp->all_reduce(t);
      double tp_sum = r < 2 ? 1 + 2 : 3 + 4;
      expect_equal(t, at::full({3}, tp_sum), "tp all_reduce(sum)", *tp);

      at::Tensor d = at::full({3}, static_cast<double>(r + 1), at::TensorOptions().dtype(dtype));
      dp->all_reduce(d);
      double dp_sum = r % 2 == 0 ? 1 + 3 : 2 + 4;
      expect_equal(d, at::full({3}, dp_sum), "dp all_reduce(sum)", *dp);

      // Gather global ranks inside tp: {0,1} or {2,3} in group order.
      at::Tensor me = at::full({1}, static_cast<double>(r), at::TensorOptions().dtype(dtype));
      at::Tensor all = at::empty({2}, me.options());
      tp->all_gather_into_tensor(all, me);
      at::Tensor want = r < 2 ? at::arange(0, 2, at::kFloat) : at::arange(2, 4, at::kFloat);
      expect_equal(all, want, "tp all_gather_into_tensor", *tp);

      // Reduce-scatter in dp: input [r+1, 10(r+1)]; dp rank k gets sum over members of entry k.
      at::Tensor rs_in = at::tensor({1.0, 10.0}, at::TensorOptions().dtype(at::kFloat)).to(dtype) *
                         static_cast<double>(r + 1);
      at::Tensor rs_out = at::empty({1}, rs_in.options());
      dp->reduce_scatter_tensor(rs_out, rs_in);
      expect_equal(rs_out, at::full({1}, (dp->rank() == 0 ? 1.0 : 10.0) * dp_sum),
                   "dp reduce_scatter_tensor", *dp);
    }
    // The world group still works after its sub-groups were formed.
    at::Tensor t = at::ones({2});
    world.all_reduce(t);
    expect_equal(t, at::full({2}, 4.0), "world all_reduce after sub-groups", world);
    expect(tp->sequence_number() == 4 && dp->sequence_number() == 4,
           "sub-group sequence numbers: tp " + std::to_string(tp->sequence_number()) + ", dp " +
               std::to_string(dp->sequence_number()));
  }));
}

TEST_CASE("Comm rejects mismatched tensors with a message naming rank, group and op", "[comm]") {
  require_all_ok(run_ranks(2, [](Comm& comm) {
    at::Tensor in = at::ones({4});
    at::Tensor wrong = at::empty({7});
    try {
      comm.all_gather_into_tensor(wrong, in);
      throw std::runtime_error("expected CommError for a wrong output size");
    } catch (const CommError& e) {
      std::string msg = e.what();
      expect(msg.find("[rank " + std::to_string(comm.rank()) + "]") != std::string::npos &&
                 msg.find("group 'world'") != std::string::npos &&
                 msg.find("all_gather_into_tensor") != std::string::npos &&
                 msg.find("[7]") != std::string::npos,
             "unhelpful message: " + msg);
    }
    comm.barrier();  // the group is still usable: nothing was sent
  }));
}

TEST_CASE("Comm timeout names rank, group, collective and sequence number", "[comm]") {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  std::string rank0_message;
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  auto errors = run_ranks(
      2,
      [&](Comm& comm) {
        comm.barrier();  // #1, both ranks
        if (comm.rank() == 1) {
          // Stays connected but never joins #2, so rank 0 sees a timeout, not a closed peer.
          rank0_done_future.wait();
          return;
        }
        at::Tensor t = at::ones({16});
        try {
          comm.all_reduce(t, ReduceOp::kMax);
          rank0_done.set_value();
          throw std::runtime_error("expected a timeout");
        } catch (const CommError& e) {
          rank0_message = e.what();
          rank0_done.set_value();
        }
      },
      options);
  require_all_ok(errors);
  INFO(rank0_message);
  CHECK(rank0_message.find("[rank 0]") != std::string::npos);
  CHECK(rank0_message.find("group 'world'") != std::string::npos);
  CHECK(rank0_message.find("all_reduce(max) #2") != std::string::npos);
  CHECK(rank0_message.find("64 bytes, Float [16] on cpu)") != std::string::npos);  // described when it failed
  CHECK(rank0_message.find("timeout 1500 ms") != std::string::npos);
}

TEST_CASE("the flight recorder keeps the last collectives and is written when one times out", "[comm]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("titan_comm_trace_" + std::to_string(getpid())) / "rank0.json").string();
  // Ranks are threads here, so both record into the one process-wide recorder; capacity 2 of
  // the 3 collectives issued (each rank's barrier #1, rank 0's all_reduce #2) keeps the 2 newest.
  comm_trace().configure(2, path, 0);
  CommOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  std::string rank0_message;
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  auto errors = run_ranks(
      2,
      [&](Comm& comm) {
        comm.barrier();  // #1
        if (comm.rank() == 1) {
          rank0_done_future.wait();  // never joins #2: rank 0 times out in it
          return;
        }
        at::Tensor t = at::ones({4});
        try {
          comm.all_reduce(t);  // #2: times out
        } catch (const CommError& e) {
          rank0_message = e.what();
        }
        rank0_done.set_value();
      },
      options);
  require_all_ok(errors);
  INFO(rank0_message);
  CHECK(rank0_message.find("all_reduce(sum) #2") != std::string::npos);
  CHECK(rank0_message.find("flight recorder") != std::string::npos);
  CHECK(rank0_message.find(path) != std::string::npos);
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  INFO(text.str());
  const auto entries = comm_trace().entries();
  REQUIRE(entries.size() == 2);
  CHECK(entries.front().op == "barrier");
  CHECK(entries.front().state == CollectiveState::kCompleted);
  const auto& last = entries.back();
  CHECK(last.op == "all_reduce(sum)");
  CHECK(last.seq == 2);
  CHECK(last.group == "world");
  CHECK(last.bytes == 16);
  CHECK(last.state == CollectiveState::kTimedOut);  // rank 1 stayed connected: a timeout
  CHECK(text.str().find("\"seq\": 2") != std::string::npos);
  CHECK(text.str().find(collective_state_name(last.state)) != std::string::npos);
  comm_trace().configure(0, "", 0);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST_CASE("Gloo's inline-emitted symbols resolve to libtorch_cpu, not to Debian-header copies",
          "[comm]") {
  // See Note [Gloo headers from Debian]: a GlooStore vtable emitted from the 2022 headers and
  // exported by this binary would interpose libtorch's (it lacks the store-v2 slots).
  for (const char* symbol : {"_ZTVN4c10d16ProcessGroupGloo9GlooStoreE",
                             "_ZTIN4c10d16ProcessGroupGloo9GlooStoreE"}) {
    void* address = dlsym(RTLD_DEFAULT, symbol);
    REQUIRE(address != nullptr);
    Dl_info info{};
    REQUIRE(dladdr(address, &info) != 0);
    INFO(symbol << " resolves into " << info.dli_fname);
    CHECK(std::string(info.dli_fname).find("libtorch_cpu.so") != std::string::npos);
  }
}

// Real processes: titan-run starts this executable twice with torchrun's environment, and the
// hidden test case below forms the world group from it (world_from_env + init_process_group).
TEST_CASE("init_process_group in processes started by titan-run", "[comm][dist]") {
  std::array<char, 4096> self{};
  ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  REQUIRE(n > 0);
  std::string command = std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " +
                        std::string(self.data(), static_cast<size_t>(n)) +
                        " '[.titan_run_worker]' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t got = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), got);
  int status = pclose(pipe);
  INFO(output);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output.find("[rank 0] worker ok: rank 0/2") != std::string::npos);
  CHECK(output.find("[rank 1] worker ok: rank 1/2") != std::string::npos);
}

TEST_CASE("worker: started by titan-run, one per rank", "[.titan_run_worker]") {
  titan::launcher::WorldInfo world = titan::launcher::world_from_env();
  REQUIRE(world.from_env);
  CommOptions options;
  options.timeout = kTestTimeout;
  std::unique_ptr<Comm> comm = titan::parallel::comm::init_process_group(
      {world.rank, world.world_size, world.local_world_size == world.world_size, world.master_addr, world.master_port},
      options);
  at::Tensor t = at::full({4}, static_cast<double>(world.rank + 1));
  comm->all_reduce(t);
  double w = world.world_size;
  REQUIRE(at::equal(t, at::full({4}, w * (w + 1) / 2)));
  comm->barrier();
  std::printf("worker ok: rank %d/%d, %s\n", comm->rank(), comm->size(),
              titan::launcher::describe(world).c_str());
}
