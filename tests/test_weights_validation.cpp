// Bad weights and non-finite steps: the safetensors header checks (trainer/checkpoint/safetensors_header.h),
// the value checks of loaded weights (Note [Weights that cannot train], trainer/checkpoint/weights_check.h),
// one error for every unexpected and missing name, and a diverged run stopping (or skipping)
// at the step where its loss turns non-finite (Note [Non-finite steps], trainer/nonfinite_step.cpp).
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "float8/float8_linear.h"
#include "tests/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/safetensors_header.h"
#include "trainer/checkpoint/weights_check.h"
#include "trainer/config/job_config.h"
#include "trainer/train.h"

using namespace titan::trainer;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return titan::testing::fresh_temp_dir("test_weights_" + name); }

// A safetensors file with this header text and `data_bytes` zero bytes of data.
std::string write_raw(const fs::path& dir, const std::string& name, const std::string& header, size_t data_bytes,
                      int64_t length_field = -1) {
  const std::string path = (dir / (name + ".safetensors")).string();
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = length_field >= 0 ? static_cast<uint64_t>(length_field) : header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(data_bytes, '\0');
  return path;
}

// One tensor entry as text, so that a test can write what nlohmann would never print.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape + ", \"data_offsets\": " + offsets + "}";
}

}  // namespace

TEST_CASE("safetensors headers: every malformed entry is one error naming the file and tensor", "[trainer]") {
  const fs::path dir = temp_dir("header");
  struct Case {
    const char* name;
    std::string header;
    size_t data;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"u8", "{" + entry("mask", "U8", "[4]", "[0, 4]") + "}", 4, "dtype 'U8' cannot be loaded (titan loads F32, BF16, F16, F64)"},
      {"bool", "{" + entry("flag", "BOOL", "[2]", "[0, 2]") + "}", 2, "dtype 'BOOL' cannot be loaded"},
      {"negative_offset", "{" + entry("w", "F32", "[2]", "[-8, 0]") + "}", 8, "are not two non-negative integers"},
      {"float_shape", "{" + entry("w", "F32", "[2.0]", "[0, 8]") + "}", 8, "has 2.0, not a non-negative integer"},
      {"negative_shape", "{" + entry("w", "F32", "[-2, -1]", "[0, 8]") + "}", 8, "has -2, not a non-negative integer"},
      {"shape_past_int64", "{" + entry("w", "F32", "[18446744073709551615]", "[0, 8]") + "}", 8, "not a non-negative integer"},
      {"numel_overflow", "{" + entry("w", "F32", "[4294967296, 4294967296]", "[0, 8]") + "}", 8, "more elements than fit in 64 bits"},
      {"bytes_overflow", "{" + entry("w", "F64", "[4611686018427387904]", "[0, 8]") + "}", 8, "more bytes than fit in 64 bits"},
      {"begin_after_end", "{" + entry("w", "F32", "[0]", "[8, 4]") + "}", 8, "begin after they end"},
      {"size_mismatch", "{" + entry("w", "F32", "[3]", "[0, 8]") + "}", 12, "hold 8 bytes, but shape [3] of F32 is 12"},
      {"past_end", "{" + entry("w", "F32", "[4]", "[0, 16]") + "}", 8, "end past the file's 8 data bytes"},
      {"overlap", "{" + entry("a", "F32", "[2]", "[0, 8]") + ", " + entry("b", "F32", "[2]", "[4, 12]") + "}", 12,
       "tensors 'a' and 'b' overlap"},
      {"duplicate", "{" + entry("w", "F32", "[1]", "[0, 4]") + ", " + entry("w", "F32", "[1]", "[4, 8]") + "}", 8,
       "names 'w' twice"},
      {"not_object", "[1, 2]", 0, "is array, not a JSON object"},
      {"entry_not_object", "{\"w\": 3}", 0, "entry is number, not an object"},
      {"unknown_field", "{\"w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4], \"x\": 1}}", 4, "unknown field 'x'"},
      {"no_offsets", "{\"w\": {\"dtype\": \"F32\", \"shape\": []}}", 4, "no 'data_offsets' field"},
      {"metadata_not_strings", "{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__ 'format' is not a string"},
      {"bad_json", "{\"w\": ", 0, "not valid JSON"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string path = write_raw(dir, c.name, c.header, c.data);
    CHECK_THROWS_WITH(read_safetensors_header(path), Contains(path) && Contains(c.expected));
  }
  // The length field: past the file's end, over the format's 100 MB limit, a file under 8 bytes.
  CHECK_THROWS_WITH(read_safetensors_header(write_raw(dir, "len_past_end", "{}", 0, 64)), Contains("past the end of the file"));
  CHECK_THROWS_WITH(read_safetensors_header(write_raw(dir, "len_huge", "{}", 0, int64_t(1) << 62)),
                    Contains("over the format's limit of 100000000 bytes"));
  { std::ofstream(dir / "short.safetensors") << "abc"; }
  CHECK_THROWS_WITH(read_safetensors_header((dir / "short.safetensors").string()), Contains("shorter than 8 bytes"));
  // Accepted: empty tensors (which overlap nothing), a scalar, metadata of strings.
  const std::string ok = write_raw(dir, "ok",
                                   "{\"__metadata__\": {\"format\": \"pt\"}, " + entry("e", "F16", "[0, 5]", "[0, 0]") + ", " +
                                       entry("s", "F64", "[]", "[0, 8]") + ", " + entry("b", "BF16", "[2]", "[8, 12]") + "}",
                                   12);
  const auto entries = read_safetensors_header(ok);
  REQUIRE(entries.size() == 3);
  CHECK(entries.at("e").begin == entries.at("e").end);
  CHECK(entries.at("s").end - entries.at("s").begin == 8);
  CHECK(entries.at("b").begin == entries.at("s").end);
  CHECK(entries.at("b").dtype == at::kBFloat16);
}

TEST_CASE("loaded weights: NaN, Inf and |x| >= 2^64 are refused with their counts", "[trainer]") {
  at::Tensor w = at::zeros({4, 4});
  CHECK(count_bad_weight_values(w).ok());
  w[0][0] = std::numeric_limits<float>::quiet_NaN();
  w[0][1] = std::numeric_limits<float>::quiet_NaN();
  w[1][0] = std::numeric_limits<float>::infinity();
  w[2][0] = 1e30f;
  w[2][1] = -1.9e19f;  // just past 2^64 = 1.845e19: its square overflows float32
  w[3][0] = 1.8e19f;   // just under: its square is 3.24e38 < FLT_MAX = 3.40e38, accepted
  w[3][1] = 1e4f;
  const WeightValueCounts c = count_bad_weight_values(w);
  CHECK(c.nan == 2);
  CHECK(c.inf == 1);
  CHECK(c.huge == 2);
  CHECK(count_bad_weight_values(w, /*check_magnitude=*/false).huge == 0);
  CHECK_THROWS_WITH(check_weight_values(w, "tensor 'x'"),
                    Contains("tensor 'x' holds 2 NaN, 1 Inf, 2 finite value(s) with |x| >= 2^64") && Contains("of its 16 values"));
  CHECK(count_bad_weight_values(at::full({3}, std::nanf(""), at::kBFloat16)).nan == 3);
}

TEST_CASE("a weights file that does not match the model: one error naming every extra and missing tensor", "[trainer]") {
  const fs::path dir = temp_dir("names");
  const std::string path = (dir / "w.safetensors").string();
  save_safetensors(path, {{"a.weight", at::zeros({2})}, {"extra.one", at::zeros({1})}, {"extra.two", at::zeros({1})}});
  int loaded = 0;
  auto load = [&](const std::string&, const at::Tensor&) { ++loaded; };
  CHECK_THROWS_WITH(load_weights_file(path, {}, {"a.weight", "b.weight", "c.weight"}, load),
                    Contains("2 tensor(s) the model lacks: 'extra.one', 'extra.two'") &&
                        Contains("2 parameter(s) missing from it: 'b.weight', 'c.weight'") && Contains(path));
  CHECK(loaded == 0);  // names are checked before any tensor is read
  save_safetensors(path, {{"a.weight", at::full({2}, 1e30)}});
  CHECK_THROWS_WITH(load_weights_file(path, {}, {"a.weight"}, load),
                    Contains("tensor 'a.weight' holds 2 finite value(s) with |x| >= 2^64"));
  CHECK(loaded == 0);
  save_safetensors(path, {{"a.weight", at::full({2}, 1e4)}});
  load_weights_file(path, {}, {"a.weight"}, load);
  CHECK(loaded == 1);
}

namespace {
JobConfig tiny_job(const fs::path& dump, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--training.seq_len", "32", "--training.local_batch_size", "2",
                                   "--training.steps", "6", "--lr_scheduler.warmup_steps", "1",
                                   "--metrics.log_freq", "1", "--job.dump_folder", dump.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}
}  // namespace

TEST_CASE("a run blown up by lr 1e6 stops at the step its loss turns non-finite, naming the module", "[trainer]") {
  // lr 1e6: AdamW's updates move every weight by ~lr per step (the largest is 1.4e11 after two),
  // and step 3's forward overflows in the first block (this seeded CPU run is deterministic).
  Trainer run(tiny_job(temp_dir("blowup"), {"--optimizer.lr", "1e6"}));
  std::string error;
  try {
    run.train();
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  INFO(error);
  CHECK_THAT(error, Contains("step 3: loss nan") && Contains("training diverged") &&
                        Contains("The first module whose forward output is not finite: 'layers.0'") &&
                        Contains("optimizer.lr is 1e+06: lower it"));
  // No update was applied at the failing step: every weight is still finite.
  for (const at::Tensor& p : run.master_params()) CHECK(count_bad_weight_values(p, false).ok());
}

TEST_CASE("training.skip_nonfinite_steps skips non-finite steps, counts them, and stops after 10 in a row", "[trainer]") {
  const fs::path dump = temp_dir("skip");
  Trainer run(tiny_job(dump, {"--optimizer.lr", "1e6", "--training.skip_nonfinite_steps", "true",
                                "--training.steps", "20"}));
  std::string error;
  try {
    run.train();
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  CHECK_THAT(error, Contains("step 12: loss") && Contains("10 steps in a row were non-finite"));
  // As above, step 3 is the first non-finite step: steps 3-11 were skipped (9), step 12 was the
  // tenth non-finite one in a row; the metrics line of step 11 counts the nine.
  std::ifstream in(dump / "metrics.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
  CHECK(last.at("step") == 11);
  CHECK(last.at("skipped_steps") == 9);
}

namespace {
// The delayed-scaling state of every float8 linear of `run`: per operand its history, scale and
// pending amax (empty tensors where the operand is unused so far).
struct DelayedState {
  std::vector<std::string> names;
  std::vector<const titan::float8::AmaxHistory*> histories;
};
DelayedState delayed_state(Trainer& run) {
  DelayedState out;
  for (titan::model::Linear* l : run.model().linears()) {
    auto* c = dynamic_cast<titan::float8::Float8LinearCompute*>(titan::model::innermost(l->compute()));
    if (!c) continue;
    titan::float8::Float8LinearState& s = c->state();
    const std::pair<const char*, titan::float8::AmaxHistory*> operands[] = {
        {"input", &s.input}, {"weight", &s.weight}, {"grad_output", &s.grad_output}};
    for (const auto& [name, h] : operands) {
      out.names.push_back(l->fqn() + "." + name);
      out.histories.push_back(h);
    }
  }
  return out;
}
}  // namespace

TEST_CASE("a skipped step leaves delayed float8 scaling as it was: its amaxes never reach the histories",
          "[trainer][float8][slow]") {
  // Step 2's gradients are made NaN after its backward (training.debug_nonfinite_at_step), when
  // its forward and backward have recorded every operand's amax, and the step is skipped. The
  // histories and scales then equal the 1-step run's and nothing is pending for step 3's sync.
  const fs::path dump = temp_dir("skip_float8");
  const std::vector<std::string> delayed = {"--float8.enable_float8_linear", "--float8.recipe_name",
                                            "tensorwise_delayed"};
  auto job = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), delayed.begin(), delayed.end());
    return tiny_job(dump / name, extra);
  };
  Trainer one(job("one", {"--training.steps", "1"}));
  one.train();
  Trainer skipped(job("skipped", {"--training.steps", "2", "--training.skip_nonfinite_steps", "true",
                                  "--training.debug_nonfinite_at_step", "2"}));
  const TrainResult r = skipped.train();
  REQUIRE(r.grad_norms.size() == 2);
  CHECK(std::isnan(r.grad_norms[1]));
  const DelayedState want = delayed_state(one), got = delayed_state(skipped);
  // input, weight and grad_output of the 7 linears of each of the debug model's 6 blocks (the
  // output projection stays high precision).
  REQUIRE(want.histories.size() == 3 * 7 * 6);
  for (size_t i = 0; i < want.histories.size(); ++i) {
    INFO(want.names[i]);
    REQUIRE(got.histories[i]->initialized);
    CHECK(at::equal(got.histories[i]->history, want.histories[i]->history));
    CHECK(at::equal(got.histories[i]->scale, want.histories[i]->scale));
    CHECK(got.histories[i]->amax.item<float>() == 0);  // nothing pending from the skipped step
  }
  // Skipping the very first step leaves every operand as before its first use.
  Trainer first(job("first", {"--training.steps", "1", "--training.skip_nonfinite_steps", "true",
                              "--training.debug_nonfinite_at_step", "1"}));
  first.train();
  for (const titan::float8::AmaxHistory* h : delayed_state(first).histories) CHECK_FALSE(h->initialized);
}
