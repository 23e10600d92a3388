// Checkpoints (docs/checkpoint.md): the shard format and its region reads, every kind of bad
// checkpoint, bitwise resume in one process and in every parallel layout (real titan-train ranks
// under titan-run, Gloo on 127.0.0.1), resharding between layouts, a run SIGKILLed at a random
// moment. Hugging Face export/import: test_checkpoint_hf.cpp.
//
// Tolerances: a resume in the layout that saved is bitwise (every loss and grad_norm equal).
// A resharded resume continues from bitwise the same state but steps in another layout, whose
// reductions run in another order: over 10 steps the losses differ by ~1e-7 relative (measured,
// as in test_parallel) and 1e-5 relative is the same bound test_parallel uses for layouts.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "tests/temp_dir.h"
#include "tests/training_runs.h"
#include "trainer/checkpoint/manager.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/train.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH)
#error "TITAN_RUN_PATH and TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace fs = std::filesystem;
using namespace titan::trainer;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;
using namespace titan::testing::runs;

namespace {

fs::path root() {
  static const fs::path dir = titan::testing::fresh_temp_dir("test_checkpoint");
  return dir;
}

// ---------------------------------------------------------------- a synthetic sharded tensor

// A Stateful that holds one [rows, cols] float tensor split over `world` ranks along `dim`
// (uneven: the last rank gets the remainder), as rank `rank` sees it.
class SlabState final : public Stateful {
 public:
  SlabState(at::Tensor full, int dim, int rank, int world) : full_(std::move(full)), dim_(dim) {
    const int64_t n = full_.size(dim), chunk = (n + world - 1) / world;
    start_ = std::min<int64_t>(n, rank * chunk);
    len_ = std::max<int64_t>(0, std::min<int64_t>(chunk, n - start_));
  }
  StateDict state_dict() override {
    StateDict sd;
    std::vector<int64_t> offsets(2, 0);
    offsets[static_cast<size_t>(dim_)] = start_;
    sd.tensors.push_back({"slab", full_.narrow(dim_, start_, len_), full_.sizes().vec(), offsets, len_ > 0});
    sd.extras = {{"note", "slab"}};
    return sd;
  }
  void load_state_dict(StateSource&) override {}

 private:
  at::Tensor full_;
  int dim_;
  int64_t start_ = 0, len_ = 0;
};

// Saves `full` split over `world` ranks along `dim` as step-1 of a fresh folder; returns it.
fs::path save_slab(const std::string& name, const at::Tensor& full, int dim, int world) {
  JobConfig cfg = parse_job_config({"--job.dump_folder", (root() / name).string(), "--checkpoint.enable_checkpoint"});
  for (int rank = world - 1; rank >= 0; --rank) {  // rank 0 last: it commits once all parts exist
    CheckpointManager m(cfg, rank, world, {{"world_size", world}}, {{"test", 1}}, c10::kCPU);
    SlabState slab(full, dim, rank, world);
    m.save(1, {{"slab", &slab}}, false);
  }
  return root() / name / "checkpoint" / "step-1";
}

at::Tensor read_region(const fs::path& dir, const at::Tensor& full, std::vector<int64_t> offsets,
                       std::vector<int64_t> lengths) {
  CheckpointReader reader(dir.string());
  at::Tensor out = at::zeros(lengths);
  reader.read("slab.slab", full.sizes().vec(), offsets, out);
  return out;
}

// ---------------------------------------------------------------- training runs

// One layout's uninterrupted 20-step run (saving step-10 and step-20), run once per name.
struct Source {
  fs::path dump;
  std::vector<Step> steps;
  int nproc;
  std::vector<std::string> layout;
};
const Source& source(const std::string& name, int nproc, const std::vector<std::string>& layout) {
  static std::map<std::string, Source> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Source s{root() / name, {}, nproc, layout};
  run_ranks(nproc, job_args(s.dump, layout), root() / (name + ".log"));
  s.steps = read_metrics(s.dump);
  REQUIRE(s.steps.size() == 20);
  return cache[name] = s;
}

// Resumes `src`'s step-10 in another run (layout `layout`, nproc ranks) and checks steps 11-20.
void resume_from(const Source& src, const std::string& name, int nproc, const std::vector<std::string>& layout,
                 double rel) {
  const fs::path dump = root() / name;
  fs::create_directories(dump / "checkpoint");
  fs::copy(src.dump / "checkpoint" / "step-10", dump / "checkpoint" / "step-10", fs::copy_options::recursive);
  const std::string log = run_ranks(nproc, job_args(dump, layout), root() / (name + ".log"));
  CHECK_THAT(log, Contains("resumed from") && Contains("at step 10"));
  check_steps(src.steps, read_metrics(dump), rel);
}

}  // namespace

// ---------------------------------------------------------------- format

TEST_CASE("CRC-32 is zlib's", "[checkpoint]") {
  CHECK(crc32_update(0, "123456789", 9) == 0xCBF43926u);
  CHECK(crc32_update(crc32_update(0, "1234", 4), "56789", 5) == 0xCBF43926u);  // streaming
  CHECK(crc32_combine(crc32_update(0, "1234", 4), crc32_update(0, "56789", 5), 5) == 0xCBF43926u);
}

TEST_CASE("shards of any split read back any region, strided too", "[checkpoint]") {
  at::Tensor full = at::arange(7 * 5, at::kFloat).view({7, 5});
  const fs::path rows = save_slab("rows", full, 0, 3);  // rows 3 + 3 + 1: uneven
  const fs::path cols = save_slab("cols", full, 1, 2);  // columns 3 + 2: strided reads
  for (const fs::path& dir : {rows, cols}) {
    INFO(dir);
    CHECK(at::equal(read_region(dir, full, {0, 0}, {7, 5}), full));
    CHECK(at::equal(read_region(dir, full, {2, 1}, {4, 3}), full.narrow(0, 2, 4).narrow(1, 1, 3)));
    CHECK(at::equal(read_region(dir, full, {6, 4}, {1, 1}), full.narrow(0, 6, 1).narrow(1, 4, 1)));
  }
  const auto manifest = CheckpointReader(rows.string()).manifest();
  CHECK(manifest.at("tensors").at("slab.slab").at("shards").size() == 3);
  CHECK(manifest.at("extras").at("slab").at("note") == "slab");
  // A shard file is plain safetensors: its tensor is the real rows of that rank.
  const auto shard = load_safetensors((rows / "rank00002.safetensors").string());
  CHECK(at::equal(shard.at("slab.slab"), full.narrow(0, 6, 1)));
  // The manifest's file CRC is the whole file's.
  std::ifstream in(rows / "rank00002.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32_update(0, bytes.data(), bytes.size()));
  CHECK(manifest.at("files").at("rank00002.safetensors").at("crc32") == crc);
}

TEST_CASE("bad checkpoints get one error naming the file and the tensor", "[checkpoint]") {
  at::Tensor full = at::randn({64, 16});
  auto expect_error = [&](const std::string& name, const std::function<void(const fs::path&)>& damage,
                          const std::vector<std::string>& words) {
    const fs::path dir = save_slab("bad_" + name, full, 0, 2);
    damage(dir);
    INFO(name);
    try {
      read_region(dir, full, {0, 0}, {64, 16});
      FAIL("no error for " << name);
    } catch (const std::runtime_error& e) {
      for (const auto& w : words) CHECK_THAT(e.what(), Contains(w));
    }
  };
  const std::string file1 = "rank00001.safetensors";
  expect_error("truncated", [&](const fs::path& d) { fs::resize_file(d / file1, fs::file_size(d / file1) - 100); },
               {file1, "slab.slab", "truncated"});
  expect_error("flipped", [&](const fs::path& d) { corrupt_byte(d / file1, 7); }, {file1, "slab.slab", "CRC-32"});
  expect_error("missing", [&](const fs::path& d) { fs::remove(d / file1); }, {file1, "slab.slab", "missing"});
  expect_error("dtype", [&](const fs::path& d) {
    std::ifstream in(d / "manifest.json");
    auto m = nlohmann::json::parse(in);
    m["tensors"]["slab.slab"]["dtype"] = "BF16";
    std::ofstream(d / "manifest.json") << m.dump();
  }, {"rank0000", "slab.slab", "F32", "BF16"});
  expect_error("shape", [&](const fs::path& d) {
    std::ifstream in(d / "manifest.json");
    auto m = nlohmann::json::parse(in);
    m["tensors"]["slab.slab"]["shape"] = {32, 16};
    std::ofstream(d / "manifest.json") << m.dump();
  }, {"slab.slab", "[32, 16]", "another model"});
  expect_error("dropped shard", [&](const fs::path& d) {
    std::ifstream in(d / "manifest.json");
    auto m = nlohmann::json::parse(in);
    m["tensors"]["slab.slab"]["shards"].erase(1);
    std::ofstream(d / "manifest.json") << m.dump();
  }, {"slab.slab", "cover 512 of the 1024"});
  expect_error("no manifest", [&](const fs::path& d) { fs::remove(d / "manifest.json"); }, {"no manifest.json"});
}

// ---------------------------------------------------------------- one process, in process

TEST_CASE("one process: resume is bitwise (tensorwise_delayed, gradient accumulation, async)", "[checkpoint][slow]") {
  // 4 micro-batches per step; the delayed amax histories and AdamW state must all come back.
  const std::vector<std::string> extra = {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise_delayed",
                                          "--checkpoint.async_mode", "async", "--checkpoint.keep_latest_k", "1"};
  const fs::path a = root() / "single_a", b = root() / "single_b";
  TrainResult whole;
  {
    Trainer t(parse_job_config(job_args(a, extra)));
    whole = t.train();
  }
  REQUIRE(whole.losses.size() == 20);
  // keep_latest_k 1: step-10 was deleted once step-20 was complete.
  CHECK(complete_checkpoints((a / "checkpoint").string()).size() == 1);
  // Resume from step-10, which the first run wrote: train it again to 10 in another folder.
  {
    std::vector<std::string> first = job_args(b, extra);
    first.insert(first.end(), {"--comm.debug_fail_at_step", "11"});  // stops the run after step 10
    Trainer t(parse_job_config(first));
    CHECK_THROWS_WITH(t.train(), Contains("fails on purpose at step 11"));
  }
  fs::create_directories(b / "checkpoint" / "step-7.tmp");  // as a save killed mid-way leaves it
  Trainer resumed(parse_job_config(job_args(b, extra)));
  CHECK(resumed.start_step() == 10);
  CHECK(!fs::exists(b / "checkpoint" / "step-7.tmp"));  // reported and removed
  const TrainResult rest = resumed.train();
  REQUIRE(rest.losses.size() == 10);
  for (size_t i = 0; i < 10; ++i) {
    INFO("step " << i + 11);
    CHECK(rest.losses[i] == whole.losses[i + 10]);
    CHECK(rest.grad_norms[i] == whole.grad_norms[i + 10]);
  }
}

TEST_CASE("resume checks the config and the model; bad paths are errors", "[checkpoint][slow]") {
  const fs::path a = root() / "checks";
  {
    // The checks below resume from the last save, step-2: a full checkpoint, not torchtitan's
    // default model-only last save.
    std::vector<std::string> args = job_args(a, {"--training.steps", "2", "--checkpoint.interval", "1",
                                                 "--checkpoint.last_save_model_only", "false"});
    Trainer(parse_job_config(args)).train();
  }
  CHECK_THROWS_WITH(Trainer(parse_job_config(job_args(a, {"--training.global_batch_size", "4"}))),
                    Contains("global_batch_size") && Contains("exclude_from_loading dataloader"));
  CHECK_THROWS_WITH(Trainer(parse_job_config(job_args(a, {"--training.seq_len", "16"}))), Contains("seq_len"));
  Trainer shape_changed(parse_job_config(
      job_args(a, {"--training.global_batch_size", "4", "--checkpoint.exclude_from_loading", "dataloader"})));
  CHECK(shape_changed.start_step() == 2);
  CHECK_THROWS_WITH(Trainer(parse_job_config(job_args(a, {"--checkpoint.load_step", "7"}))),
                    Contains("load_step 7") && Contains("1, 2"));
  {  // a manifest of another model
    const fs::path manifest = a / "checkpoint" / "step-2" / "manifest.json";
    std::ifstream in(manifest);
    auto m = nlohmann::json::parse(in);
    m["model"]["dim"] = 512;
    std::ofstream(manifest) << m.dump();
  }
  CHECK_THROWS_WITH(Trainer(parse_job_config(job_args(a))), Contains("step-2") && Contains("\"dim\":512"));
  CHECK_THROWS_WITH(Trainer(parse_job_config(job_args(root() / "nothing", {"--checkpoint.initial_load_path",
                                                                           "/no/such/weights"}))),
                    Contains("/no/such/weights") && Contains("does not exist"));
}

// ---------------------------------------------------------------- every layout, real ranks

// Each case: the layout's uninterrupted run (step-10 saved on the way) and a fresh run resumed
// from that step-10, compared step by step.
TEST_CASE("FSDP 2 + float8 rowwise + gradient accumulation: bitwise resume", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {"--parallelism.data_parallel_shard_degree", "2",
                                           "--float8.enable_float8_linear", "--float8.recipe_name", "rowwise"};
  resume_from(source("fsdp2_rowwise", 2, layout), "fsdp2_rowwise_resumed", 2, layout, 0);
}

TEST_CASE("TP 2 + float8 tensorwise_delayed: bitwise resume", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {"--parallelism.tensor_parallel_degree", "2", "--float8.enable_float8_linear",
                                           "--float8.recipe_name", "tensorwise_delayed"};
  resume_from(source("tp2_delayed", 2, layout), "tp2_delayed_resumed", 2, layout, 0);
}

// MX keeps no state between steps (block scales are recomputed from the weights every time), so
// the checkpoint holds what a high-precision run's does and the resume is bitwise all the same.
TEST_CASE("TP 2 + MXFP8 (rceil scales): bitwise resume", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {"--parallelism.tensor_parallel_degree", "2", "--model.converters", "mx",
                                           "--mx.recipe_name", "mxfp8_cublas_rceil"};
  resume_from(source("tp2_mxfp8", 2, layout), "tp2_mxfp8_resumed", 2, layout, 0);
}

TEST_CASE("HSDP 2x2 + float8 all-gather with precomputed scales: bitwise resume", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {
      "--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "2",
      "--float8.enable_float8_linear", "--float8.enable_fsdp_float8_all_gather",
      "--float8.precompute_float8_dynamic_scale_for_fsdp"};
  resume_from(source("hsdp", 4, layout), "hsdp_resumed", 4, layout, 0);
}

TEST_CASE("FSDP 2 x TP 2 resumes bitwise and reshards into 1, FSDP 4, TP 2", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {"--parallelism.data_parallel_shard_degree", "2",
                                           "--parallelism.tensor_parallel_degree", "2"};
  const Source& src = source("fsdp2_tp2", 4, layout);
  resume_from(src, "fsdp2_tp2_resumed", 4, layout, 0);
  resume_from(src, "fsdp2_tp2_to_1", 1, {}, 1e-5);
  resume_from(src, "fsdp2_tp2_to_fsdp4", 4, {"--parallelism.data_parallel_shard_degree", "4"}, 1e-5);
  resume_from(src, "fsdp2_tp2_to_tp2", 2, {"--parallelism.tensor_parallel_degree", "2"}, 1e-5);
}

TEST_CASE("FSDP 3 (uneven shards) resumes bitwise and reshards into TP 2; 1 reshards into FSDP 2 x TP 2",
          "[checkpoint][dist][slow]") {
  // torchtitan #1136: uneven FSDP shards. Global batch 6 = 3 ranks x 2 rows.
  const std::vector<std::string> fsdp3 = {"--training.global_batch_size", "6"};
  const Source& src = source("fsdp3", 3, fsdp3);
  resume_from(src, "fsdp3_resumed", 3, fsdp3, 0);
  resume_from(src, "fsdp3_to_tp2", 2, {"--training.global_batch_size", "6", "--parallelism.tensor_parallel_degree", "2"},
              1e-5);
  resume_from(source("single", 1, {}), "single_to_fsdp2_tp2", 4,
              {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2"}, 1e-5);
}

TEST_CASE("a run SIGKILLed at a random moment resumes with the same loss lines", "[checkpoint][dist][slow]") {
  const std::vector<std::string> layout = {"--parallelism.data_parallel_shard_degree", "2",
                                           "--float8.enable_float8_linear", "--float8.recipe_name", "rowwise"};
  const Source& src = source("fsdp2_rowwise", 2, layout);
  const fs::path dump = root() / "killed";
  std::vector<std::string> args = job_args(dump, layout);
  args.insert(args.end(), {"--checkpoint.interval", "5", "--checkpoint.async_mode", "async"});
  const std::string cmd = "OMP_NUM_THREADS=1 exec " + std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " +
                          TITAN_TRAIN_PATH + joined(args) + " > " + (root() / "killed.log").string() + " 2>&1";
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const size_t kill_after = std::uniform_int_distribution<size_t>(6, 18)(rng);  // metrics lines seen
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // one process group: titan-run and its ranks die together
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(dump / "metrics_rank0.jsonl");  // counted by newlines: the last line may be partial
    if (static_cast<size_t>(std::count(std::istreambuf_iterator<char>(in), {}, '\n')) >= kill_after) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(5, 60)(rng)));
  }
  kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("killed after " << kill_after << " metrics lines");
  // The same command again: it resumes from the latest complete checkpoint.
  const std::string log = run_ranks(2, args, root() / "killed_resumed.log");
  const auto steps = read_metrics(dump);
  REQUIRE(!steps.empty());
  CHECK((steps.front().step - 1) % 5 == 0);
  check_steps(src.steps, steps, 0);
}

TEST_CASE("PP 2 resumes bitwise and reshards into 1 process and FSDP 2 and PP 4", "[checkpoint][dist][slow][pipeline]") {
  // A checkpoint holds each parameter's regions whatever stage saved them (Note [Checkpoint
  // shards]), so any layout reads it. 1 process and PP 4 accumulate the same 4 micro-batches of 2
  // rows in the same order: the same numbers as the PP 2 run up to the grad norm's float64 sum order.
  const std::vector<std::string> pp2 = {"--parallelism.pipeline_parallel_degree", "2",
                                        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
                                        "--training.local_batch_size", "8",
                                        "--parallelism.pipeline_parallel_microbatch_size", "2"};
  const Source& src = source("pp2", 2, pp2);
  resume_from(src, "pp2_resumed", 2, pp2, 0);
  resume_from(src, "pp2_to_1", 1, {}, 1e-12);
  resume_from(src, "pp2_to_fsdp2", 2, {"--parallelism.data_parallel_shard_degree", "2"}, 1e-5);
  resume_from(src, "pp2_to_pp4", 4,
              {"--parallelism.pipeline_parallel_degree", "4", "--parallelism.data_parallel_shard_degree", "1",
               "--training.local_batch_size", "8", "--parallelism.pipeline_parallel_microbatch_size", "2"},
              1e-12);
}

TEST_CASE("CP 2 resumes bitwise and reshards into 1 process and CP 4", "[checkpoint][dist][slow][cp]") {
  // Context parallelism changes no saved tensor: FSDP's shards over dp_shard x cp are regions of
  // each parameter like any other (Note [Checkpoint shards]). CP 1 and CP 4 compute the same
  // steps in another float32 order (the layout tolerance). Global batch 4 (CI time: the cp ranks
  // share their rows, so each would otherwise accumulate 4 micro-batches per step).
  const std::vector<std::string> cp2 = {"--parallelism.context_parallel_degree", "2",
                                        "--parallelism.context_parallel_rotate_method", "alltoall",
                                        "--training.global_batch_size", "4"};
  const Source& src = source("cp2", 2, cp2);
  resume_from(src, "cp2_resumed", 2, cp2, 0);
  resume_from(src, "cp2_to_1", 1, {"--training.global_batch_size", "4"}, 1e-5);
  resume_from(src, "cp2_to_cp4", 4,
              {"--parallelism.context_parallel_degree", "4", "--parallelism.context_parallel_rotate_method",
               "titan_ulysses", "--training.global_batch_size", "4"},
              1e-5);
}

TEST_CASE("Qwen3-MoE at EP 2 resumes bitwise (expert_bias included) and reshards into 1 process, EP 4, EP 2 x efsdp 2, "
          "EP 2 x ETP 2",
          "[checkpoint][dist][slow][moe]") {
  // Each EP rank saves its whole experts as a region of the stacked weights (Note [Checkpoint
  // shards]) and rank 0 the load-balancing biases, identical on every rank; 1 process, EP 4 and
  // EP 2 over 4 ranks (experts FSDP-sharded over efsdp 2) continue from the same state in another
  // reduction order (the layout tolerance).
  const std::vector<std::string> moe = {"--model.name", "qwen3", "--model.flavor", "debugmodel_moe_small"};
  auto with = [&](const std::vector<std::string>& layout) {
    std::vector<std::string> args = moe;
    args.insert(args.end(), layout.begin(), layout.end());
    return args;
  };
  const std::vector<std::string> ep2 = with({"--parallelism.expert_parallel_degree", "2"});
  const Source& src = source("moe_ep2", 2, ep2);
  resume_from(src, "moe_ep2_resumed", 2, ep2, 0);
  resume_from(src, "moe_ep2_to_1", 1, moe, 1e-5);
  resume_from(src, "moe_ep2_to_ep4", 4, with({"--parallelism.expert_parallel_degree", "4"}), 1e-5);
  resume_from(src, "moe_ep2_to_efsdp2", 4, ep2, 1e-5);  // 4 ranks: each EP rank's experts FSDP-sharded over 2
  resume_from(src, "moe_ep2_to_etp2", 4,  // experts sharded over EP and over TP on their hidden dim
              with({"--parallelism.expert_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2",
                    "--parallelism.expert_tensor_parallel_degree", "2"}),
              1e-5);
}

TEST_CASE("DeepSeek-V3 at PP 2 x EP 2 resumes bitwise and reshards into 1 process", "[checkpoint][dist][slow][moe]") {
  // The dense first block and the MoE blocks on two pipeline stages, each stage's experts split
  // over 2 EP ranks: the same checkpoint format (each rank its region of every tensor, rank 0 the
  // load-balancing biases), so the resume in the same layout is bitwise and one process
  // continues from the same state in another reduction order (the layout tolerance).
  const std::vector<std::string> ds3 = {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel_small"};
  std::vector<std::string> layout = ds3;
  for (const char* a : {"--parallelism.pipeline_parallel_degree", "2", "--parallelism.expert_parallel_degree", "2"})
    layout.push_back(a);
  const Source& src = source("ds3_pp2_ep2", 4, layout);
  resume_from(src, "ds3_pp2_ep2_resumed", 4, layout, 0);
  resume_from(src, "ds3_pp2_ep2_to_1", 1, ds3, 1e-5);
}

TEST_CASE("DeepSeek-V3 with multi-token prediction at EP 2 resumes bitwise and reshards into 1 process",
          "[checkpoint][dist][slow][moe]") {
  // The depth's block (mtp_layers.0, an MoE block with its experts split over EP) and its own
  // modules are parameters like the others: saved by name, each rank its region. One process
  // continues in another reduction order: the layouts' bound (measured there: 5e-8).
  const std::vector<std::string> mtp = {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel_small",
                                        "--model.mtp_layers", "1"};
  std::vector<std::string> layout = mtp;
  layout.insert(layout.end(), {"--parallelism.expert_parallel_degree", "2"});
  const Source& src = source("ds3_mtp_ep2", 2, layout);
  resume_from(src, "ds3_mtp_ep2_resumed", 2, layout, 0);
  resume_from(src, "ds3_mtp_ep2_to_1", 1, mtp, 1e-5);
}

TEST_CASE("Qwen3 with a tied embedding at PP 2 resumes bitwise and reshards into 1 process and PP 2 x FSDP 2",
          "[checkpoint][dist][slow][pipeline]") {
  // The first stage's rank writes the tied embedding; the last stage's copy loads it from there.
  const std::vector<std::string> tied = {"--model.name", "qwen3", "--model.flavor", "debugmodel_small"};
  std::vector<std::string> pp2 = tied;
  pp2.insert(pp2.end(), {"--parallelism.pipeline_parallel_degree", "2"});
  const Source& src = source("tied_pp2", 2, pp2);
  resume_from(src, "tied_pp2_resumed", 2, pp2, 0);
  // One process adds the tied weight's two gradients (the embedding's, the output's) in another
  // order than PP 2's cross-stage sum, and FSDP reduces in another order again: reduction order
  // only, the layouts' bound (tests/test_moe_layouts.cpp's tied layouts of this flavor), far
  // below the factor of 2 of a gradient summed twice or dropped.
  const double reduction_order = 1e-5;
  resume_from(src, "tied_pp2_to_1", 1, tied, reduction_order);
  std::vector<std::string> pp2_fsdp2 = pp2;
  pp2_fsdp2.insert(pp2_fsdp2.end(), {"--parallelism.data_parallel_shard_degree", "2"});
  resume_from(src, "tied_pp2_to_pp2_fsdp2", 4, pp2_fsdp2, reduction_order);
}

TEST_CASE("gpt-oss at TP 2 (sharded biases and sinks) resumes bitwise and reshards into 1 process and EP 2",
          "[checkpoint][dist][slow][moe]") {
  // TP shards the q/k/v biases and the sinks with their heads and the experts' hidden dim with
  // mlp1's bias; the replicated output biases are saved once. Another layout continues in another
  // reduction order: the layouts' bound (tests/test_gpt_oss_layouts.cpp measured 6e-8).
  const std::vector<std::string> gpt_oss = {"--model.name", "gpt_oss", "--model.flavor", "debugmodel_small"};
  std::vector<std::string> tp2 = gpt_oss;
  tp2.insert(tp2.end(), {"--parallelism.tensor_parallel_degree", "2"});
  const Source& src = source("gpt_oss_tp2", 2, tp2);
  resume_from(src, "gpt_oss_tp2_resumed", 2, tp2, 0);
  resume_from(src, "gpt_oss_tp2_to_1", 1, gpt_oss, 1e-5);
  std::vector<std::string> ep2 = gpt_oss;
  ep2.insert(ep2.end(), {"--parallelism.expert_parallel_degree", "2"});
  resume_from(src, "gpt_oss_tp2_to_ep2", 2, ep2, 1e-5);
}
