// gpt-oss's Hugging Face format (model/gpt_oss/hf_format.h): GptOssForCausalLM's names, its
// stacked experts (gate_up_proj [E, D, 2H] with gate and linear interleaved, down_proj [E, H, D],
// their biases), the config HF's GptOssConfig reads, the refusal of the Hub's MXFP4 experts by
// name, and an export that loads back bitwise.
#include <catch2/catch.hpp>

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/transpose.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "tests/temp_dir.h"
#include "trainer/checkpoint/hf_weights.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/train.h"

namespace fs = std::filesystem;
using namespace titan::trainer;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;

namespace {

fs::path root() {
  static const fs::path dir = titan::testing::fresh_temp_dir("titan_hf_gpt_oss");
  return dir;
}

}  // namespace

TEST_CASE("gpt-oss's Hugging Face format: GptOssForCausalLM's names, stacked biased experts, its config, the MXFP4 "
          "refusal",
          "[checkpoint][gpt_oss]") {
  const titan::model::ModelArgs g = titan::model::model_flavor("gpt_oss", "debugmodel_small");
  CHECK(hf_architecture(g) == std::make_pair(std::string("GptOssForCausalLM"), std::string("gpt_oss")));
  CHECK(hf_names("layers.2.attention.sinks", g) == std::vector<std::string>{"model.layers.2.self_attn.sinks"});
  CHECK(hf_names("layers.0.attention.wq.bias", g) == std::vector<std::string>{"model.layers.0.self_attn.q_proj.bias"});
  CHECK(hf_names("layers.1.moe.router.gate.bias", g) == std::vector<std::string>{"model.layers.1.mlp.router.bias"});
  CHECK(hf_names("layers.1.moe.experts.mlp1_weight", g) ==
        std::vector<std::string>{"model.layers.1.mlp.experts.gate_up_proj"});
  CHECK(hf_names("layers.1.moe.experts.mlp2_bias", g) ==
        std::vector<std::string>{"model.layers.1.mlp.experts.down_proj_bias"});
  CHECK_FALSE(hf_buffer_name("layers.1.moe.expert_bias", g));  // HF routes by the logits alone
  // The stacked experts are one HF tensor each (write_hf_folder transposes them: shapes below).
  CHECK(titan_slot_from_hf("model.layers.1.mlp.experts.gate_up_proj", g).fqn == "layers.1.moe.experts.mlp1_weight");
  CHECK(titan_slot_from_hf("model.layers.1.mlp.experts.down_proj", g).fqn == "layers.1.moe.experts.mlp2_weight");
  const at::Tensor wq = at::randn({g.n_heads * g.head_dim(), g.dim});
  CHECK(at::equal(to_hf_layout("layers.0.attention.wq.weight", wq, g), wq));  // both rotate halves
  const nlohmann::json config = hf_config(g, at::kBFloat16);
  CHECK(config.at("layer_types") ==
        nlohmann::json::array({"sliding_attention", "full_attention", "sliding_attention", "full_attention"}));
  CHECK(config.at("sliding_window") == 8);
  CHECK(config.at("rope_scaling").at("rope_type") == "yarn");
  CHECK(config.at("rope_scaling").at("factor") == 32.0);
  CHECK(config.at("swiglu_limit") == 7.0);
  CHECK(config.at("num_local_experts") == 8);
  CHECK(config.at("experts_per_token") == 2);
  CHECK(config.at("attention_bias") == true);
  // Another window in config.json: refused on load, naming titan's key.
  const fs::path dir = root() / "config_window";
  fs::create_directories(dir);
  nlohmann::json other = config;
  other["sliding_window"] = 128;
  std::ofstream(dir / "config.json") << other.dump();
  CHECK_THROWS_WITH(read_hf_checkpoint(dir.string(), g, [](const auto&, const auto&) {}),
                    Contains("sliding_window") && Contains("sliding_window_size"));
  // The Hub's MXFP4 experts are named and refused with what to do instead.
  CHECK_THROWS_WITH(titan_slot_from_hf("model.layers.0.mlp.experts.gate_up_proj_blocks", g),
                    Contains("MXFP4") && Contains("dequantize=True"));
}

TEST_CASE("Hugging Face export of gpt-oss (sinks, biases, stacked experts) loads back bitwise",
          "[checkpoint][slow][gpt_oss]") {
  auto job = [](const fs::path& dump, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model.name", "gpt_oss", "--model.flavor", "debugmodel_small",
                                     "--training.seq_len", "32", "--training.local_batch_size", "2",
                                     "--training.num_threads", "1", "--metrics.peak_flops", "1e12",
                                     "--job.dump_folder", dump.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args);
  };
  const fs::path dump = root() / "hf_gpt_oss", step3 = dump / "checkpoint" / "step-3";
  Trainer saver(job(dump, {"--training.steps", "3", "--checkpoint.enable", "--checkpoint.interval", "100",
                           "--checkpoint.last_save_in_hf"}));
  saver.train();
  const auto tensors = load_safetensors((step3 / "model-00001-of-00001.safetensors").string());
  CHECK(tensors.at("model.layers.1.mlp.experts.gate_up_proj").sizes().vec() == std::vector<int64_t>{8, 64, 64});
  CHECK(tensors.at("model.layers.3.mlp.experts.down_proj").sizes().vec() == std::vector<int64_t>{8, 32, 64});
  CHECK(tensors.at("model.layers.0.self_attn.sinks").sizes().vec() == std::vector<int64_t>{4});
  CHECK(tensors.count("model.layers.0.mlp.experts.gate_up_proj_bias") == 1);
  // gate_up_proj is mlp1 [E, 2H, D] transposed: its interleaved gate/linear rows are HF's last dim.
  for (size_t i = 0; i < saver.param_names().size(); ++i)
    if (saver.param_names()[i] == "layers.1.moe.experts.mlp1_weight")
      CHECK(at::equal(tensors.at("model.layers.1.mlp.experts.gate_up_proj").to(at::kFloat),
                      saver.master_params()[i].transpose(1, 2).to(tensors.at("model.layers.1.mlp.experts.gate_up_proj")
                                                                        .scalar_type()).to(at::kFloat)));
  Trainer loaded(job(dump / "load", {"--training.steps", "1", "--checkpoint.initial_load_path", step3.string(),
                                     "--checkpoint.initial_load_in_hf"}));
  REQUIRE(saver.master_params().size() == loaded.master_params().size());
  for (size_t i = 0; i < saver.master_params().size(); ++i) {
    INFO(saver.param_names()[i]);
    CHECK(at::equal(saver.master_params()[i], loaded.master_params()[i]));
  }
}
