// Trainer pieces (LR schedule, AdamW, clipping, safetensors, memory accounting) and whole runs:
// bitwise determinism, gradient accumulation, loss falling on the default corpus.
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/randn.h>

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "trainer/config.h"
#include "trainer/memory.h"
#include "parallel/parallelize.h"
#include "trainer/optimizer.h"
#include "trainer/safetensors.h"
#include "tests/temp_dir.h"
#include "trainer/train.h"

using namespace titan::trainer;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir(const std::string& name) { return titan::testing::fresh_temp_dir("test_trainer_" + name); }

JobConfig small_job(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--training.seq_len", "64",  "--training.local_batch_size", "2",
                                   "--training.steps",   "4",   "--lr_scheduler.warmup_steps", "2",
                                   "--training.seed",    "5",   "--metrics.log_freq", "1",
                                   "--job.dump_folder",  temp_dir("run").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}
}  // namespace

TEST_CASE("LR schedule is torchtitan's warmup-stable-decay", "[trainer]") {
  LrSchedule s{10, 2, -1, "linear", 0.0};
  // warmup: (s+1)/(w+1) for 0-based s; decay over the 8 remaining steps with a virtual extra step.
  CHECK(s.factor(1) == Approx(1.0 / 3));
  CHECK(s.factor(2) == Approx(2.0 / 3));
  CHECK(s.factor(3) == Approx(1.0));
  CHECK(s.factor(4) == Approx(1.0 - 1.0 / 8));
  CHECK(s.factor(10) == Approx(1.0 - 7.0 / 8));
  LrSchedule cosine{10, 0, 0.5, "cosine", 0.1};
  CHECK(cosine.factor(1) == Approx(1.0));  // stable phase: 10 + 1 - 0 - 5 = 6 steps
  CHECK(cosine.factor(10) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 4.0 / 5))));
  LrSchedule sqrt_s{4, 0, -1, "sqrt", 0.0};
  CHECK(sqrt_s.factor(2) == Approx(1.0 - std::sqrt(0.25)));
}

TEST_CASE("AdamW matches the closed-form first steps", "[trainer]") {
  at::Tensor p = at::ones({3}).requires_grad_(true);
  AdamW opt({p}, {"AdamW", 0.9, 0.95, 1e-8, 0.1});
  p.mutable_grad() = at::full({3}, 0.5);
  opt.step(0.01);
  // Step 1: m_hat = g, v_hat = g^2 -> update = lr * g/|g| = lr; decay multiplies p by 1 - lr*wd.
  const double expected = 1.0 * (1 - 0.01 * 0.1) - 0.01 * 0.5 / (0.5 + 1e-8);
  CHECK(p[0].item<double>() == Approx(expected).epsilon(1e-6));
  CHECK(opt.state_bytes() == 2 * 3 * 4 + 4);
}

TEST_CASE("clip_grad_norm returns the global norm and scales", "[trainer]") {
  at::Tensor a = at::zeros({2}).requires_grad_(true), b = at::zeros({1}).requires_grad_(true);
  a.mutable_grad() = at::full({2}, 3.0);
  b.mutable_grad() = at::full({1}, 4.0);
  const double norm = titan::parallel::clip_grad_norm({a.grad(), b.grad()}, {true, true}, 1.0, /*world=*/nullptr);
  CHECK(norm == Approx(std::sqrt(34.0)));
  CHECK(a.grad()[0].item<double>() == Approx(3.0 / std::sqrt(34.0)).epsilon(1e-5));
}

TEST_CASE("safetensors round trip and errors", "[trainer]") {
  const fs::path dir = temp_dir("st");
  const std::string path = (dir / "w.safetensors").string();
  at::Tensor x = at::randn({3, 5}), y = at::randn({7}).to(at::kBFloat16);
  save_safetensors(path, {{"a.weight", x}, {"b", y}}, {{"format", "pt"}});
  CHECK_FALSE(fs::exists(path + ".tmp." + std::to_string(getpid())));
  auto loaded = load_safetensors(path);
  CHECK(at::equal(loaded.at("a.weight"), x));
  CHECK(at::equal(loaded.at("b"), y));
  { std::ofstream(dir / "bad.safetensors") << "not a safetensors file"; }
  CHECK_THROWS_WITH(load_safetensors((dir / "bad.safetensors").string()), Catch::Contains("bad.safetensors"));
  CHECK_THROWS_WITH(load_safetensors((dir / "missing.safetensors").string()), Catch::Contains("cannot open"));
}

TEST_CASE("CPU memory tracker counts live storage bytes", "[trainer]") {
  install_cpu_memory_tracker();
  const int64_t before = memory_stats(c10::kCPU).current_bytes;
  {
    at::Tensor big = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    CHECK(memory_stats(c10::kCPU).current_bytes - before == 4 << 20);
  }
  CHECK(memory_stats(c10::kCPU).current_bytes == before);
  reset_peak_memory(c10::kCPU);
  CHECK(memory_stats(c10::kCPU).peak_bytes == before);
}

TEST_CASE("two identical runs give bit-identical losses", "[trainer][slow]") {
  Trainer a(small_job()), b(small_job());
  const TrainResult ra = a.train(), rb = b.train();
  REQUIRE(ra.losses.size() == 4);
  CHECK(ra.losses == rb.losses);  // exact: same threads, same kernels, same order
  CHECK(ra.grad_norms == rb.grad_norms);
}

TEST_CASE("gradient accumulation equals the large-batch step", "[trainer][slow]") {
  // Same global batch of 4 rows: one micro-batch of 4 vs two of 2. The loss is the same
  // token-mean; only float32 summation order differs (~1e-6 relative over these few steps).
  Trainer whole(small_job({"--training.local_batch_size", "4"}));
  Trainer accum(small_job({"--training.local_batch_size", "2", "--training.global_batch_size", "4"}));
  const TrainResult rw = whole.train(), ra = accum.train();
  for (size_t i = 0; i < rw.losses.size(); ++i) CHECK(ra.losses[i] == Approx(rw.losses[i]).epsilon(1e-5));
}

TEST_CASE("initial weights load and export round trip", "[trainer][slow]") {
  const std::string path = (temp_dir("export") / "final.safetensors").string();
  Trainer first(small_job({"--checkpoint.export_path", path}));
  first.train();
  Trainer second(small_job({"--checkpoint.initial_load_path", path, "--training.steps", "1"}));
  for (size_t i = 0; i < first.master_params().size(); ++i)
    CHECK(at::equal(first.master_params()[i], second.master_params()[i]));
  CHECK_THROWS_WITH(Trainer(small_job({"--checkpoint.initial_load_path", "/nonexistent.safetensors"})),
                    Catch::Contains("/nonexistent.safetensors"));
}

TEST_CASE("the debug model learns the default corpus", "[trainer][slow]") {
  // The shipped CPU config: 100 steps of the debug model on the fortunes corpus.
  const std::string config = std::string(std::getenv("TITAN_SOURCE_DIR")) + "/configs/llama3_debugmodel.toml";
  Trainer trainer(parse_job_config({"--job.config_file", config, "--job.dump_folder", temp_dir("learn").string()}));
  const TrainResult r = trainer.train();
  REQUIRE(r.losses.size() == 100);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) first += r.losses[i] / 10;
  for (int i = 90; i < 100; ++i) last += r.losses[i] / 10;
  INFO("mean loss of steps 1-10: " << first << ", steps 91-100: " << last);
  // Byte-level vocab of 258: a uniform guess is ln(258) = 5.55. Learning the byte statistics
  // of English alone brings it under ~3; require a clear fall of at least 40%.
  CHECK(first > 4.0);
  CHECK(last < 0.6 * first);
}
