// The validation loop in one process: its loss is the mean cross entropy that an independent
// PyTorch Llama (scripts/hf_llama_check.py --mean-ce) computes over the same tokens; validating
// changes no training loss (bitwise), a resumed run validates as the uninterrupted one, and a
// bad validation dataset is a config error at start-up. (Layouts against one process:
// tests/test_parallel.cpp.)
#include <sys/wait.h>

#include <ATen/ops/cat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/loader.h"
#include "tests/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/config/job_config.h"
#include "trainer/train.h"

#ifndef TITAN_PYTHON
#error "TITAN_PYTHON must be defined by the build"
#endif

using namespace titan::trainer;
using namespace titan::trainer::config;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// A small JSON-lines corpus: 60 documents of varied text, one an empty "text" (BOS EOS).
std::string write_corpus(const fs::path& dir) {
  const std::string path = (dir / "val.jsonl").string();
  std::ofstream out(path);
  for (int i = 0; i < 60; ++i) {
    std::string text = i == 7 ? "" : "document " + std::to_string(i) + ": the quick brown fox " +
                                         std::string(static_cast<size_t>(i % 13), 'a' + static_cast<char>(i % 26)) +
                                         " jumps over the lazy dog " + std::to_string(i * i);
    out << nlohmann::json{{"text", text}}.dump() << "\n";
  }
  return path;
}

std::vector<std::string> base_args(const fs::path& dump, const std::string& corpus) {
  return {"--training.seq_len", "32", "--training.local_batch_size", "2", "--training.num_threads", "1",
          "--metrics.peak_flops", "1e12", "--training.seed", "5", "--job.dump_folder", dump.string(),
          "--validation.enable", "--validation.dataset", "jsonl", "--validation.dataset_path", corpus,
          "--validation.local_batch_size", "2", "--validation.seq_len", "32", "--validation.freq", "2"};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST_CASE("the validation loss is the mean cross entropy of an independent Llama over the same tokens",
          "[validation][slow]") {
  const fs::path dir = titan::testing::fresh_temp_dir("validation_ce");
  const std::string corpus = write_corpus(dir);
  const fs::path hf = dir / "hf";
  Trainer trainer(parse_job_config(with(base_args(dir / "run", corpus),
                                        {"--training.steps", "2", "--checkpoint.export_path", hf.string(),
                                         "--checkpoint.export_format", "hf"})));
  const TrainResult r = trainer.train();
  REQUIRE(r.validation_losses.size() == 1);
  CHECK(r.validation_losses[0].first == 2);
  // The same tokens, read as the validator reads them: every whole global batch of one pass.
  const auto tokenizer = titan::data::make_tokenizer("");
  titan::data::DataConfig dc;
  dc.dataset = "jsonl";
  dc.dataset_path = corpus;
  dc.seq_len = 32;
  dc.global_batch_size = 2;
  dc.seed = 5;
  titan::data::DataLoader loader(dc, *tokenizer);
  std::vector<at::Tensor> inputs, labels;
  for (int64_t b = 0; b < loader.windows_per_epoch() / 2; ++b) {
    const titan::data::Batch batch = loader.next_batch();
    inputs.push_back(batch.inputs);
    labels.push_back(batch.labels);
  }
  const fs::path batches = dir / "batches.safetensors";
  titan::trainer::checkpoint::save_safetensors(batches.string(), {{"inputs", at::cat(inputs)}, {"labels", at::cat(labels)}});
  const std::string source = std::getenv("TITAN_SOURCE_DIR") ? std::getenv("TITAN_SOURCE_DIR") : ".";
  const fs::path out = dir / "ce.json";
  const std::string cmd = std::string(TITAN_PYTHON) + " " + source + "/scripts/hf_llama_check.py --mean-ce " +
                          hf.string() + " " + batches.string() + " > " + out.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  INFO(text);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const nlohmann::json ce = nlohmann::json::parse(text.substr(text.find('{')));
  CHECK(ce["tokens"].get<int64_t>() == static_cast<int64_t>(inputs.size()) * 2 * 32);
  // Both sides compute float32 logits with different op orders (~1e-6 relative per logit) and
  // sum the token losses in float64: the means agree to ~1e-6; 1e-5 leaves 10x.
  CHECK(r.validation_losses[0].second == Approx(ce["mean_ce"].get<double>()).epsilon(1e-5));
}

TEST_CASE("validating changes no training loss, and a resumed run validates as the uninterrupted one",
          "[validation][slow]") {
  const fs::path dir = titan::testing::fresh_temp_dir("validation_bitwise");
  const std::string corpus = write_corpus(dir);
  // tensorwise_delayed: its amax histories are state a validation forward must not touch.
  const std::vector<std::string> f8 = {"--float8.enable_float8_linear", "--float8.recipe_name", "tensorwise_delayed",
                                       "--training.steps", "6"};
  Trainer with_validation(parse_job_config(with(with(base_args(dir / "a", corpus), f8),
                                                {"--checkpoint.enable", "--checkpoint.interval", "3"})));
  const TrainResult a = with_validation.train();
  std::vector<std::string> no_validation = with(base_args(dir / "b", corpus), f8);
  no_validation.push_back("--validation.no_enable");
  const TrainResult b = Trainer(parse_job_config(no_validation)).train();
  REQUIRE(a.losses.size() == 6);
  REQUIRE(b.validation_losses.empty());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(a.losses[i] == b.losses[i]);  // bitwise
    CHECK(a.grad_norms[i] == b.grad_norms[i]);
  }
  REQUIRE(a.validation_losses.size() == 3);  // steps 2, 4, 6
  CHECK(a.validation_losses[0].second != a.validation_losses[2].second);  // the model changed
  // Resume from step-3: the validations after it are the same bits.
  fs::remove_all(dir / "a" / "checkpoint" / "step-6");
  const TrainResult c = Trainer(parse_job_config(with(with(base_args(dir / "a", corpus), f8),
                                                      {"--checkpoint.enable", "--checkpoint.interval", "3"})))
                            .train();
  REQUIRE(c.validation_losses.size() == 2);  // steps 4, 6
  CHECK(c.validation_losses[0] == a.validation_losses[1]);
  CHECK(c.validation_losses[1] == a.validation_losses[2]);
}

TEST_CASE("a missing or too small validation set is a config error at start-up; too many steps are capped",
          "[validation]") {
  const fs::path dir = titan::testing::fresh_temp_dir("validation_errors");
  const std::string corpus = write_corpus(dir);
  CHECK_THROWS_WITH(Trainer(parse_job_config(with(base_args(dir / "r", (dir / "nope.jsonl").string()),
                                                  {"--training.steps", "1"}))),
                    Contains("validation.dataset = jsonl") && Contains("nope.jsonl"));
  CHECK_THROWS_WITH(Trainer(parse_job_config(with(base_args(dir / "r", corpus),
                                                  {"--training.steps", "1", "--validation.local_batch_size", "4096"}))),
                    Contains("fewer than one validation batch"));
  CHECK_THROWS_WITH(Trainer(parse_job_config({"--training.steps", "1", "--validation.enable", "--job.dump_folder",
                                              (dir / "r").string()})),
                    Contains("validation.dataset = c4_validation"));
  // More steps than the set holds: every whole batch once, the same number as steps = -1.
  const TrainResult all = Trainer(parse_job_config(with(base_args(dir / "all", corpus), {"--training.steps", "2"}))).train();
  const TrainResult capped = Trainer(parse_job_config(with(base_args(dir / "capped", corpus),
                                                           {"--training.steps", "2", "--validation.steps", "100000"})))
                                 .train();
  REQUIRE(capped.validation_losses.size() == 1);
  CHECK(capped.validation_losses[0] == all.validation_losses[0]);
}
