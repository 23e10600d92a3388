// Hugging Face weights in and out (docs/checkpoint.md): Llama 3, Qwen3 and Qwen3-MoE exported,
// imported back bit for bit, and the export's logits computed in Python (transformers when it is
// importable, else scripts/hf_llama_check.py's re-implementation of HF's modeling code) equal to
// titan's within float32 reduction error (the script's docstring gives the tolerance); and the
// mapping each family declares (model/hf_format.h) as hf_weights.h reads it.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/core/grad_mode.h>

#include <sys/wait.h>

#include <cstdlib>
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

#if !defined(TITAN_PYTHON)
#error "TITAN_PYTHON must be defined by the build"
#endif

namespace fs = std::filesystem;
using namespace titan::trainer;
using namespace titan::trainer::checkpoint;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;

namespace {

fs::path root() {
  static const fs::path dir = titan::testing::fresh_temp_dir("test_checkpoint_hf");
  return dir;
}

// Every master weight of `loaded` (from `saver`'s Hugging Face export) equals `saver`'s, bitwise.
void check_same_masters(Trainer& saver, Trainer& loaded) {
  REQUIRE(saver.master_params().size() == loaded.master_params().size());
  for (size_t i = 0; i < saver.master_params().size(); ++i) {
    INFO(saver.param_names()[i]);
    CHECK(at::equal(saver.master_params()[i], loaded.master_params()[i]));
  }
}

// Logits: `trainer`'s forward on fixed tokens vs the HF folder `hf`'s model computed by
// scripts/hf_llama_check.py (transformers when it is installed, else the script's own
// re-implementation of HF's modeling code; its docstring gives the tolerance).
void check_hf_logits(Trainer& trainer, const fs::path& hf, const fs::path& dump) {
  at::Tensor tokens = at::arange(32, at::kLong).remainder(200).view({1, 32}) * 7 % 251;
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = trainer.model().forward(tokens, trainer.model().rope_table()).to(at::kFloat);
  }
  const fs::path probe = dump / "titan_logits.safetensors";
  save_safetensors(probe.string(), {{"tokens", tokens}, {"logits", logits}});
  const std::string source = std::getenv("TITAN_SOURCE_DIR") ? std::getenv("TITAN_SOURCE_DIR") : ".";
  const std::string cmd = std::string(TITAN_PYTHON) + " " + source + "/scripts/hf_llama_check.py " + hf.string() +
                          " " + probe.string() + " > " + (dump / "hf_check.log").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(dump / "hf_check.log");
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  INFO(log);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_THAT(log, Contains("logits match"));
}


}  // namespace

TEST_CASE("Hugging Face names, layouts and refusals are the family's declaration", "[checkpoint]") {
  using titan::model::model_flavor;
  const titan::model::ModelArgs llama = model_flavor("llama3", "debugmodel");
  CHECK(hf_architecture(llama) == std::make_pair(std::string("LlamaForCausalLM"), std::string("llama")));
  CHECK(hf_names("layers.3.attention.wq.weight", llama) ==
        std::vector<std::string>{"model.layers.3.self_attn.q_proj.weight"});
  CHECK(hf_names("output.weight", llama) == std::vector<std::string>{"lm_head.weight"});
  CHECK(titan_slot_from_hf("model.layers.3.mlp.down_proj.weight", llama).fqn == "layers.3.feed_forward.w2.weight");
  CHECK(titan_slot_from_hf("model.layers.0.self_attn.rotary_emb.inv_freq", llama).fqn.empty());
  CHECK_THROWS_WITH(titan_slot_from_hf("model.layers.0.self_attn.c_attn.weight", llama),
                    Contains("'model.layers.0.self_attn.c_attn.weight' is not a llama weight titan knows"));
  CHECK_THROWS_WITH(hf_names("layers.0.attention.wz.weight", llama), Contains("no Hugging Face name"));
  // Llama's q and k rows go out permuted within each head and come back; v as it is.
  const at::Tensor wq = at::randn({llama.n_heads * llama.head_dim(), llama.dim});
  const at::Tensor permuted = to_hf_layout("layers.1.attention.wq.weight", wq, llama);
  CHECK_FALSE(at::equal(permuted, wq));
  CHECK(at::equal(from_hf_layout("layers.1.attention.wq.weight", permuted, llama), wq));
  CHECK(at::equal(to_hf_layout("layers.1.attention.wv.weight", wq, llama), wq));
  const nlohmann::json llama_config = hf_config(llama, at::kBFloat16);
  CHECK(llama_config.at("mlp_bias") == false);
  CHECK(llama_config.at("torch_dtype") == "bfloat16");
  CHECK(llama_config.at("rope_scaling").at("rope_type") == "llama3");
  CHECK_FALSE(llama_config.contains("use_sliding_window"));

  const titan::model::ModelArgs qwen3 = model_flavor("qwen3", "debugmodel");  // tied: no lm_head
  CHECK(titan_slot_from_hf("lm_head.weight", qwen3).fqn.empty());
  const at::Tensor qwen3_wq = at::randn({qwen3.n_heads * qwen3.head_dim(), qwen3.dim});
  CHECK(at::equal(to_hf_layout("layers.1.attention.wq.weight", qwen3_wq, qwen3), qwen3_wq));  // halves in titan too
  CHECK(hf_config(qwen3, at::kFloat).at("max_window_layers") == qwen3.n_layers);

  const titan::model::ModelArgs moe = model_flavor("qwen3", "debugmodel_moe_small");
  const std::vector<std::string> experts = hf_names("layers.1.moe.experts.w3", moe);
  REQUIRE(experts.size() == 8);
  CHECK(experts[5] == "model.layers.1.mlp.experts.5.up_proj.weight");
  const TitanSlot slot = titan_slot_from_hf("model.layers.1.mlp.experts.5.up_proj.weight", moe);
  CHECK(slot.fqn == "layers.1.moe.experts.w3");
  CHECK(slot.expert == 5);
  CHECK_THROWS_WITH(titan_slot_from_hf("model.layers.1.mlp.experts.8.up_proj.weight", moe),
                    Contains("is expert 8, but titan's model has 8 experts per layer"));
  CHECK(hf_config(moe, at::kFloat).at("num_experts") == 8);

  // config.json is checked where a difference would not show in a shape.
  auto config_error = [&](const nlohmann::json& config, const titan::model::ModelArgs& args) {
    const fs::path dir = root() / "config_only";
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump();
    try {
      read_hf_checkpoint(dir.string(), args, [](const auto&, const auto&) {});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json scaled = llama_config;
  scaled["rope_scaling"].erase("rope_type");  // older configs leave it out: accepted (no weights then)
  CHECK_THAT(config_error(scaled, llama), !Contains("Hugging Face config"));
  scaled["rope_scaling"]["factor"] = 4.0;
  CHECK_THAT(config_error(scaled, llama), Contains("has rope_scaling {") && Contains("but titan's model has {") &&
                                              Contains("choose the matching model.flavor"));
  scaled["rope_scaling"] = nullptr;
  CHECK_THAT(config_error(scaled, llama), Contains("has rope_scaling null"));
  nlohmann::json more_experts = hf_config(moe, at::kFloat);
  more_experts["num_experts"] = 16;
  CHECK_THAT(config_error(more_experts, moe), Contains("has num_experts = 16, but titan's model has num_experts = 8: "
                                                       "choose the matching model.name and model.flavor"));
  CHECK_THAT(config_error(hf_config(qwen3, at::kFloat), moe),
             Contains("has model_type = \"qwen3\", but titan's model has model_type = \"qwen3_moe\""));

  // A model HF's class would compute differently is refused, naming why; it has no HF buffer.
  titan::model::ModelArgs llama_qk = llama;
  llama_qk.qk_norm = true;
  CHECK_THROWS_WITH(hf_architecture(llama_qk), Contains("titan's llama3 model has no Hugging Face counterpart: "
                                                        "Llama with q/k norms, half rotation or experts"));
  CHECK_FALSE(hf_buffer_name("layers.0.moe.expert_bias", llama_qk).has_value());
  titan::model::ModelArgs shared = moe;
  shared.moe->num_shared_experts = 1;
  CHECK_THROWS_WITH(hf_names("layers.0.attention.wq.weight", shared),
                    Contains("titan's qwen3 model has no Hugging Face counterpart: shared experts"));
}

TEST_CASE("DeepSeek-V3's Hugging Face format: DeepseekV3ForCausalLM's names, its router bias, refusals",
          "[checkpoint][deepseek_v3]") {
  using titan::trainer::checkpoint::hf_architecture;
  using titan::trainer::checkpoint::hf_buffer_name;
  using titan::trainer::checkpoint::hf_config;
  using titan::trainer::checkpoint::hf_names;
  using titan::trainer::checkpoint::titan_slot_from_hf;
  titan::model::ModelArgs small = titan::model::model_flavor("deepseek_v3", "debugmodel_small");
  small.max_seq_len = 2048;  // training.seq_len's: within original_seq_len 4096, no YaRN
  CHECK(hf_architecture(small) == std::make_pair(std::string("DeepseekV3ForCausalLM"), std::string("deepseek_v3")));
  // q through its rank (q_lora_rank 32): q_a_proj, q_a_layernorm, q_b_proj; keys and values
  // through kv_a_proj_with_mqa (the shared rope key included), kv_a_layernorm, kv_b_proj.
  CHECK(hf_names("layers.0.attention.wq_a.weight", small) ==
        std::vector<std::string>{"model.layers.0.self_attn.q_a_proj.weight"});
  CHECK(hf_names("layers.2.attention.q_norm.weight", small) ==
        std::vector<std::string>{"model.layers.2.self_attn.q_a_layernorm.weight"});
  CHECK(hf_names("layers.1.attention.wkv_a.weight", small) ==
        std::vector<std::string>{"model.layers.1.self_attn.kv_a_proj_with_mqa.weight"});
  CHECK(hf_names("layers.0.feed_forward.w2.weight", small) ==
        std::vector<std::string>{"model.layers.0.mlp.down_proj.weight"});  // the dense first block
  CHECK(hf_names("layers.3.moe.shared_experts.w1.weight", small) ==
        std::vector<std::string>{"model.layers.3.mlp.shared_experts.gate_proj.weight"});
  CHECK(hf_names("layers.1.moe.experts.w3", small).size() == 8);  // one up_proj per expert
  CHECK(hf_names("layers.1.moe.experts.w3", small)[7] == "model.layers.1.mlp.experts.7.up_proj.weight");
  // The bias that only chooses is the router's e_score_correction_bias.
  CHECK(hf_buffer_name("layers.2.moe.expert_bias", small) == "model.layers.2.mlp.gate.e_score_correction_bias");
  CHECK(titan_slot_from_hf("model.layers.2.mlp.gate.e_score_correction_bias", small).fqn == "layers.2.moe.expert_bias");
  const nlohmann::json config = hf_config(small, at::kBFloat16);
  CHECK((config.at("first_k_dense_replace") == 1 && config.at("q_lora_rank") == 32 && config.at("n_group") == 4 &&
         config.at("topk_group") == 2 && config.at("routed_scaling_factor") == 2.5 && config.at("v_head_dim") == 32 &&
         config.at("rope_scaling").is_null()));  // YaRN off: max_seq_len <= original_seq_len
  // The flavor's own max_seq_len (16384, torchtitan's default before training.seq_len) extends
  // the context: YaRN as HF spells it, mscale_all_dim = mscale (HF's cos/sin then unscaled).
  const nlohmann::json big = hf_config(titan::model::model_flavor("deepseek_v3", "671B"), at::kBFloat16);
  CHECK((big.at("q_lora_rank") == 1536 && big.at("first_k_dense_replace") == 3));
  CHECK(big.at("rope_scaling") == nlohmann::json({{"type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 4096},
                                                  {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0},
                                                  {"mscale_all_dim", 1.0}}));
  // The softmax-routed flavors (DeepSeek-V2's router) have no DeepseekV3ForCausalLM counterpart.
  CHECK_THROWS_WITH(hf_config(titan::model::model_flavor("deepseek_v3", "debugmodel"), at::kBFloat16),
                    Catch::Contains("no Hugging Face counterpart") && Catch::Contains("softmax"));
  // Multi-token prediction: HF's depth k is block n_layers + k (4 + k here), with the block's names,
  // its own, and its copies of the embedding and head (read past: titan's depths share the model's).
  titan::model::ModelArgs mtp = small;
  mtp.mtp_layers = 1;
  CHECK(hf_config(mtp, at::kBFloat16).at("num_nextn_predict_layers") == 1);
  CHECK(hf_names("mtp_layers.0.attention.wq_a.weight", mtp) ==
        std::vector<std::string>{"model.layers.4.self_attn.q_a_proj.weight"});
  CHECK(hf_names("mtp_layers.0.mtp_norm.weight", mtp) == std::vector<std::string>{"model.layers.4.shared_head.norm.weight"});
  CHECK(hf_names("mtp_layers.0.eh_proj.weight", mtp) == std::vector<std::string>{"model.layers.4.eh_proj.weight"});
  CHECK(hf_names("mtp_layers.0.moe.experts.w1", mtp)[3] == "model.layers.4.mlp.experts.3.gate_proj.weight");
  CHECK(hf_buffer_name("mtp_layers.0.moe.expert_bias", mtp) == "model.layers.4.mlp.gate.e_score_correction_bias");
  CHECK(titan_slot_from_hf("model.layers.4.hnorm.weight", mtp).fqn == "mtp_layers.0.hnorm.weight");
  CHECK(titan_slot_from_hf("model.layers.4.mlp.experts.5.down_proj.weight", mtp).fqn == "mtp_layers.0.moe.experts.w2");
  CHECK(titan_slot_from_hf("model.layers.4.shared_head.head.weight", mtp).fqn.empty());  // the head's copy
  CHECK(titan_slot_from_hf("model.layers.4.embed_tokens.weight", mtp).fqn.empty());
  // Without depths of its own, titan reads past the Hub checkpoint's (DeepSeek-V3 holds one).
  CHECK(titan_slot_from_hf("model.layers.4.eh_proj.weight", small).fqn.empty());
  CHECK(titan_slot_from_hf("model.layers.4.self_attn.o_proj.weight", small).fqn.empty());
  // A family whose HF class has no such blocks refuses them.
  titan::model::ModelArgs llama_mtp = titan::model::model_flavor("llama3", "debugmodel");
  llama_mtp.mtp_layers = 1;
  CHECK_THROWS_WITH(hf_architecture(llama_mtp), Catch::Contains("model.mtp_layers = 1 (LlamaForCausalLM has no "
                                                                "multi-token prediction blocks)"));
}

TEST_CASE("Hugging Face export of DeepSeek-V3 with multi-token prediction loads back bitwise", "[checkpoint][slow][moe]") {
  auto job = [](const fs::path& dump, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel_small",
                                     "--model.mtp_layers", "1", "--training.seq_len", "32",
                                     "--training.local_batch_size", "2", "--training.num_threads", "1",
                                     "--metrics.peak_flops", "1e12", "--job.dump_folder", dump.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args);
  };
  const fs::path dump = root() / "hf_ds3_mtp", step3 = dump / "checkpoint" / "step-3";
  Trainer saver(job(dump, {"--training.steps", "3", "--checkpoint.enable", "--checkpoint.interval", "100",
                           "--checkpoint.last_save_in_hf"}));
  saver.train();
  const auto tensors = load_safetensors((step3 / "model-00001-of-00001.safetensors").string());
  for (const char* name : {"model.layers.4.enorm.weight", "model.layers.4.eh_proj.weight",
                           "model.layers.4.shared_head.norm.weight", "model.layers.4.mlp.experts.7.up_proj.weight",
                           "model.layers.4.self_attn.kv_b_proj.weight"}) {
    INFO(name);
    CHECK(tensors.count(name) == 1);
  }
  CHECK(tensors.at("model.layers.4.eh_proj.weight").sizes().vec() == std::vector<int64_t>{128, 256});
  Trainer loaded(job(dump / "load", {"--training.steps", "1", "--checkpoint.initial_load_path", step3.string(),
                                     "--checkpoint.initial_load_in_hf"}));
  check_same_masters(saver, loaded);
}

TEST_CASE("Llama 4's Hugging Face format: Llama4ForCausalLM's text names, fused experts, its config, refusals",
          "[checkpoint][llama4]") {
  using titan::model::model_flavor;
  const titan::model::ModelArgs l4 = model_flavor("llama4", "debugmodel_small_irope");
  CHECK(hf_architecture(l4) == std::make_pair(std::string("Llama4ForCausalLM"), std::string("llama4_text")));
  // w1 and w3 [E, H, D] go out as one gate_up_proj [E, D, 2H]; w2 [E, D, H] as down_proj [E, H, D].
  CHECK(hf_names("layers.1.moe.experts.w1", l4) ==
        std::vector<std::string>{"model.layers.1.feed_forward.experts.gate_up_proj"});
  CHECK(hf_names("layers.1.moe.experts.w3", l4) == hf_names("layers.1.moe.experts.w1", l4));
  CHECK(hf_names("layers.3.moe.experts.w2", l4) ==
        std::vector<std::string>{"model.layers.3.feed_forward.experts.down_proj"});
  CHECK(hf_names("layers.0.feed_forward.w1.weight", l4) ==
        std::vector<std::string>{"model.layers.0.feed_forward.gate_proj.weight"});
  CHECK(hf_names("layers.1.moe.shared_experts.w2.weight", l4) ==
        std::vector<std::string>{"model.layers.1.feed_forward.shared_expert.down_proj.weight"});
  CHECK(hf_names("layers.1.moe.router.gate.weight", l4) ==
        std::vector<std::string>{"model.layers.1.feed_forward.router.weight"});
  CHECK_FALSE(hf_buffer_name("layers.1.moe.expert_bias", l4));  // HF routes by the logits alone
  const at::Tensor w1 = at::randn({8, 192, 128});
  CHECK(to_hf_layout("layers.1.moe.experts.w1", w1, l4).sizes().vec() == std::vector<int64_t>{8, 128, 192});
  CHECK(at::equal(from_hf_layout("layers.1.moe.experts.w1", to_hf_layout("layers.1.moe.experts.w1", w1, l4), l4), w1));
  const at::Tensor wq = at::randn({l4.n_heads * l4.head_dim(), l4.dim});
  CHECK(at::equal(to_hf_layout("layers.1.attention.wq.weight", wq, l4), wq));  // interleaved pairs in HF too
  const nlohmann::json config = hf_config(l4, at::kBFloat16);
  CHECK(config.at("no_rope_layers") == nlohmann::json::array({0, 1, 0, 1}));  // NoPE blocks 0 and 2
  CHECK(config.at("moe_layers") == nlohmann::json::array({1, 3}));
  CHECK(config.at("attention_chunk_size") == 12);
  CHECK(config.at("intermediate_size") == l4.moe_hidden_dim);
  CHECK(config.at("intermediate_size_mlp") == l4.ffn_hidden_dim());
  CHECK(config.at("use_qk_norm") == false);
  // Meta's checkpoints normalize q and k: refused on load, naming the key.
  const fs::path dir = root() / "llama4_config";
  fs::create_directories(dir);
  nlohmann::json meta = config;
  meta["use_qk_norm"] = true;
  std::ofstream(dir / "config.json") << meta.dump();
  CHECK_THROWS_WITH(read_hf_checkpoint(dir.string(), l4, [](const auto&, const auto&) {}),
                    Contains("has use_qk_norm = true, but titan's model has use_qk_norm = false"));
  titan::model::ModelArgs softmax = l4;
  softmax.moe->score_func = "softmax";
  CHECK_THROWS_WITH(hf_architecture(softmax), Contains("score_func 'softmax'"));
}

TEST_CASE("Hugging Face export of Llama 4 (fused experts, iRoPE) loads back bitwise", "[checkpoint][slow][moe]") {
  auto job = [](const fs::path& dump, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model.name", "llama4", "--model.flavor", "debugmodel_small_irope",
                                     "--training.seq_len", "32", "--training.local_batch_size", "2",
                                     "--training.num_threads", "1", "--metrics.peak_flops", "1e12",
                                     "--job.dump_folder", dump.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args);
  };
  const fs::path dump = root() / "hf_llama4", step3 = dump / "checkpoint" / "step-3";
  Trainer saver(job(dump, {"--training.steps", "3", "--checkpoint.enable", "--checkpoint.interval", "100",
                           "--checkpoint.last_save_in_hf"}));
  saver.train();
  const auto tensors = load_safetensors((step3 / "model-00001-of-00001.safetensors").string());
  CHECK(tensors.at("model.layers.1.feed_forward.experts.gate_up_proj").sizes().vec() ==
        std::vector<int64_t>{8, 128, 2 * 192});
  CHECK(tensors.at("model.layers.3.feed_forward.experts.down_proj").sizes().vec() == std::vector<int64_t>{8, 192, 128});
  CHECK(tensors.count("model.layers.0.feed_forward.gate_proj.weight") == 1);  // a dense block
  CHECK(tensors.count("model.layers.1.feed_forward.experts.0.gate_proj.weight") == 0);
  Trainer loaded(job(dump / "load", {"--training.steps", "1", "--checkpoint.initial_load_path", step3.string(),
                                     "--checkpoint.initial_load_in_hf"}));
  check_same_masters(saver, loaded);
}

TEST_CASE("Hugging Face export loads back bitwise and gives HF Llama's logits", "[checkpoint][slow]") {
  const fs::path dump = root() / "hf", hf = dump / "hf_export";
  std::vector<std::string> args = {"--training.seq_len", "32", "--training.local_batch_size", "2",
                                   "--training.steps", "3", "--training.num_threads", "1", "--metrics.peak_flops", "1e12",
                                   "--job.dump_folder", dump.string(), "--checkpoint.export_path", hf.string(),
                                   "--checkpoint.export_format", "hf"};
  Trainer first(parse_job_config(args));
  first.train();
  for (const char* f : {"config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors"})
    CHECK(fs::exists(hf / f));
  const auto tensors = load_safetensors((hf / "model-00001-of-00001.safetensors").string());
  CHECK(tensors.count("model.layers.0.self_attn.q_proj.weight") == 1);
  CHECK(tensors.count("lm_head.weight") == 1);
  // Import: --checkpoint.initial_load_path names the folder; every master comes back bitwise.
  args.insert(args.end(), {"--checkpoint.initial_load_path", hf.string()});
  Trainer second(parse_job_config(args));
  for (size_t i = 0; i < first.master_params().size(); ++i) {
    INFO(first.param_names()[i]);
    CHECK(at::equal(first.master_params()[i], second.master_params()[i]));
  }
  {
    // torchtitan v0.2.2's spellings, as its docs give them: last_save_in_hf alone (the last save
    // is model-only by default) writes the last checkpoint as an HF folder (step-3, export
    // dtype), initial_load_in_hf reads one from initial_load_path or, when that is empty,
    // model.hf_assets_path; the masters come back bitwise again.
    const fs::path tt = dump / "torchtitan_hf";
    std::vector<std::string> save = {"--training.seq_len", "32", "--training.local_batch_size", "2",
                                     "--training.steps", "3", "--training.num_threads", "1", "--metrics.peak_flops",
                                     "1e12", "--job.dump_folder", tt.string(), "--checkpoint.enable",
                                     "--checkpoint.interval", "100", "--checkpoint.last_save_in_hf"};
    Trainer saver(parse_job_config(save));
    saver.train();
    const fs::path step3 = tt / "checkpoint" / "step-3";
    CHECK(fs::exists(step3 / "model.safetensors.index.json"));
    CHECK(!fs::exists(tt / "checkpoint" / "step-3.tmp"));
    std::vector<std::string> load = {"--training.seq_len", "32", "--training.steps", "3", "--metrics.peak_flops",
                                     "1e12", "--job.dump_folder", (dump / "tt_load").string(),
                                     "--model.tokenizer_path", "", "--checkpoint.initial_load_in_hf",
                                     "--model.hf_assets_path", step3.string()};
    Trainer loaded(parse_job_config(load));
    for (size_t i = 0; i < saver.master_params().size(); ++i) {
      INFO(saver.param_names()[i]);
      CHECK(at::equal(saver.master_params()[i], loaded.master_params()[i]));
    }
    // A folder that is not an HF checkpoint is refused naming the key that pointed to it.
    load.back() = (dump / "tt_load").string();
    CHECK_THROWS_WITH(Trainer(parse_job_config(load)),
                      Contains("model.hf_assets_path") && Contains("is not a Hugging Face checkpoint"));
  }
  {  // an HF config whose numerics differ from titan's model is refused by name
    const fs::path other = dump / "hf_other";
    fs::copy(hf, other, fs::copy_options::recursive);
    std::ifstream in(other / "config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["rope_theta"] = 10000.0;
    std::ofstream(other / "config.json") << cfg.dump();
    std::vector<std::string> bad = args;
    bad.back() = other.string();
    CHECK_THROWS_WITH(Trainer(parse_job_config(bad)), Contains("rope_theta") && Contains("config.json"));
  }
  check_hf_logits(second, hf, dump);
}

TEST_CASE("Hugging Face export of Qwen3-MoE and Qwen3 loads back bitwise and gives HF Qwen3's logits",
          "[checkpoint][slow][moe]") {
  auto job = [](const std::string& flavor, const fs::path& dump, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model.name", "qwen3", "--model.flavor", flavor, "--training.seq_len", "32",
                                     "--training.local_batch_size", "2", "--training.num_threads", "1",
                                     "--metrics.peak_flops", "1e12", "--job.dump_folder", dump.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_job_config(args);
  };
  auto same_masters = [](Trainer& a, Trainer& b) {
    REQUIRE(a.master_params().size() == b.master_params().size());
    for (size_t i = 0; i < a.master_params().size(); ++i) {
      INFO(a.param_names()[i]);
      CHECK(at::equal(a.master_params()[i], b.master_params()[i]));
    }
  };
  {
    // Qwen3-MoE through torchtitan's switches: the last save (step-3) as an HF folder, read back
    // with initial_load_in_hf. Each expert of titan's stacked [E, ...] weights is its own HF
    // tensor; expert_bias, a buffer, is not exported, and the importing run starts with it zero,
    // routing as HF's model does.
    const fs::path dump = root() / "hf_qwen3_moe", step3 = dump / "checkpoint" / "step-3";
    Trainer saver(job("debugmodel_moe_small", dump,
                      {"--training.steps", "3", "--checkpoint.enable", "--checkpoint.interval", "100",
                       "--checkpoint.last_save_in_hf"}));
    saver.train();
    const auto tensors = load_safetensors((step3 / "model-00001-of-00001.safetensors").string());
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.layers.0.mlp.gate.weight", {8, 128}},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", {64, 128}},
        {"model.layers.3.mlp.experts.7.up_proj.weight", {64, 128}},
        {"model.layers.3.mlp.experts.7.down_proj.weight", {128, 64}},
        {"model.layers.0.self_attn.q_norm.weight", {32}},
        {"model.layers.0.self_attn.q_proj.weight", {128, 128}},
        {"lm_head.weight", {258, 128}}};  // the byte-level tokenizer's vocabulary
    for (const auto& [name, shape] : shapes) {
      INFO(name);
      REQUIRE(tensors.count(name) == 1);
      CHECK(tensors.at(name).sizes().vec() == shape);
    }
    CHECK(tensors.size() == 1 + 4 * (4 + 2 + 1 + 3 * 8 + 2) + 1 + 1);  // embed, blocks, norm, lm_head
    std::ifstream config_in(step3 / "config.json");
    const auto config = nlohmann::json::parse(config_in);
    CHECK(config.at("architectures") == nlohmann::json({"Qwen3MoeForCausalLM"}));
    CHECK(config.at("model_type") == "qwen3_moe");
    CHECK(config.at("num_experts") == 8);
    CHECK(config.at("num_experts_per_tok") == 2);
    CHECK(config.at("moe_intermediate_size") == 64);
    CHECK(config.at("norm_topk_prob") == true);
    CHECK(config.at("tie_word_embeddings") == false);
    Trainer loaded(job("debugmodel_moe_small", dump / "load",
                       {"--training.steps", "3", "--checkpoint.initial_load_in_hf", "--checkpoint.initial_load_path",
                        step3.string()}));
    same_masters(saver, loaded);
    {  // an expert the index does not list is named, with the file that should list it
      const fs::path other = dump / "hf_missing_expert";
      fs::copy(step3, other, fs::copy_options::recursive);
      std::ifstream in(other / "model.safetensors.index.json");
      auto index = nlohmann::json::parse(in);
      index["weight_map"].erase("model.layers.1.mlp.experts.5.up_proj.weight");
      std::ofstream(other / "model.safetensors.index.json") << index.dump();
      CHECK_THROWS_WITH(Trainer(job("debugmodel_moe_small", dump / "load_missing",
                                    {"--checkpoint.initial_load_path", other.string()})),
                        Contains("model.layers.1.mlp.experts.5.up_proj.weight") && Contains(other.string()) &&
                            Contains("missing from it"));
      CHECK_THROWS_WITH(read_hf_checkpoint(other.string(), saver.model().args(), [](const auto&, const auto&) {}),
                        Contains("model.layers.1.mlp.experts.5.up_proj.weight") &&
                            Contains((other / "model.safetensors.index.json").string()) &&
                            Contains("layers.1.moe.experts.w3"));
    }
    {  // a layer's experts spread over two shards, as the Hub's large checkpoints have them
      const fs::path split = dump / "hf_split";
      fs::create_directories(split);
      fs::copy_file(step3 / "config.json", split / "config.json");
      std::vector<std::pair<std::string, at::Tensor>> first_half, second_half;
      nlohmann::json weight_map;
      for (const auto& [name, t] : tensors) {
        const bool odd_expert = name.find(".experts.") != std::string::npos &&
                                std::stoi(name.substr(name.find(".experts.") + 9)) % 2 == 1;
        (odd_expert ? second_half : first_half).emplace_back(name, t);
        weight_map[name] = odd_expert ? "b.safetensors" : "a.safetensors";
      }
      save_safetensors((split / "a.safetensors").string(), first_half);
      save_safetensors((split / "b.safetensors").string(), second_half);
      std::ofstream(split / "model.safetensors.index.json") << nlohmann::json({{"weight_map", weight_map}}).dump();
      Trainer from_split(job("debugmodel_moe_small", dump / "load_split",
                             {"--training.steps", "3", "--checkpoint.initial_load_path", split.string()}));
      same_masters(saver, from_split);
    }
    check_hf_logits(loaded, step3, dump);
  }
  {
    // Dense Qwen3 (debugmodel ties its output projection to the embedding: no lm_head).
    const fs::path dump = root() / "hf_qwen3", hf = dump / "hf_export";
    Trainer first(job("debugmodel", dump,
                      {"--training.steps", "1", "--checkpoint.export_path", hf.string(), "--checkpoint.export_format",
                       "hf"}));
    first.train();
    const auto tensors = load_safetensors((hf / "model-00001-of-00001.safetensors").string());
    CHECK(tensors.count("model.layers.7.self_attn.k_norm.weight") == 1);
    CHECK(tensors.count("model.layers.7.mlp.down_proj.weight") == 1);
    CHECK(tensors.count("lm_head.weight") == 0);
    std::ifstream config_in(hf / "config.json");
    const auto config = nlohmann::json::parse(config_in);
    CHECK(config.at("architectures") == nlohmann::json({"Qwen3ForCausalLM"}));
    CHECK(config.at("tie_word_embeddings") == true);
    Trainer second(
        job("debugmodel", dump / "load", {"--training.steps", "1", "--checkpoint.initial_load_path", hf.string()}));
    same_masters(first, second);
    check_hf_logits(second, hf, dump);
  }
}
