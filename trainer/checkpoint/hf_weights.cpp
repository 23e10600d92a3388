#include "trainer/checkpoint/hf_weights.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include "model/param_path.h"
#include "trainer/checkpoint/safetensors.h"
#include "util/atomic_file.h"

namespace titan::trainer::checkpoint {
namespace fs = std::filesystem;
namespace {

// HF's LlamaConfig spelling of Llama 3.1 RoPE scaling ("rope_type": "llama3"), or null.
nlohmann::json hf_rope_scaling(const model::RopeScaling& r) {
  if (!r.enabled) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

// Suffix pairs inside a block: titan (after "layers.<i>.") <-> HF (after "model.layers.<i>.").
// One table for every family: a name a family lacks (q_norm in Llama) is then simply not among
// its parameters.
const std::vector<std::pair<std::string, std::string>> kBlockNames = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_norm.weight"},
    {"attention.k_norm.weight", "self_attn.k_norm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"moe.router.gate.weight", "mlp.gate.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
};
// A block's stacked experts: titan (after "layers.<i>.") <-> expert j's HF tensor (after
// "model.layers.<i>.mlp.experts.<j>.").
const std::vector<std::pair<std::string, std::string>> kExpertNames = {
    {"moe.experts.w1", "gate_proj.weight"},
    {"moe.experts.w2", "down_proj.weight"},
    {"moe.experts.w3", "up_proj.weight"},
};
// A block's persistent buffers (titan after "layers.<i>." <-> HF after "model.layers.<i>."), per
// HF model_type: only where the family's Hub checkpoints hold the tensor. DeepSeek-V3's would be
// {"moe.expert_bias", "mlp.gate.e_score_correction_bias"} (its router's bias that only chooses,
// as expert_bias does). Qwen3-MoE's format has none: Qwen3MoeForCausalLM routes by the softmax
// scores alone, so its exports leave the bias out and a run from one starts balancing from zero.
const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& buffer_names_by_model_type() {
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> table = {
      {"llama", {}},
      {"qwen3", {}},
      {"qwen3_moe", {}},
  };
  return table;
}
const std::vector<std::pair<std::string, std::string>>& block_buffer_names(const model::ModelArgs& args) {
  static const std::vector<std::pair<std::string, std::string>> none;
  std::string model_type;
  try {
    model_type = hf_architecture(args).second;
  } catch (const std::invalid_argument&) {  // no HF counterpart: no buffer either
    return none;
  }
  const auto& table = buffer_names_by_model_type();
  const auto it = table.find(model_type);
  return it == table.end() ? none : it->second;
}

const std::vector<std::pair<std::string, std::string>> kTopNames = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// HF's name of titan's "layers.<i>.<rest>": "model.layers.<i>.<hf_rest>".
std::string hf_block_name(int64_t layer, const std::string& hf_rest) { return "model." + model::layer_path(layer, hf_rest); }

// layers.<i>.moe.experts.w1 / w2 / w3: E experts' weights in one [E, ...] tensor.
bool is_stacked_experts(const std::string& fqn) {
  const std::optional<model::LayerPath> block = model::parse_layer_path(fqn);
  if (!block) return false;
  for (const auto& [t, h] : kExpertNames)
    if (block->rest == t) return true;
  return false;
}

// Heads of wq / wk of a model that rotates interleaved pairs (0: no permutation).
int64_t rotary_heads(const std::string& fqn, const model::ModelArgs& args) {
  if (args.rope_rotate_half) return 0;  // titan rotates halves, as HF does
  auto ends = [&](const char* s) {
    const std::string suffix(s);
    return fqn.size() >= suffix.size() && fqn.compare(fqn.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("attention.wq.weight")) return args.n_heads;
  if (ends("attention.wk.weight")) return args.kv_heads();
  return 0;
}

void write_json_atomic(const fs::path& path, const nlohmann::json& j) {
  util::write_file_atomic(path.string(), j.dump(2) + '\n');
}

std::string shape_text(const at::Tensor& t) { return nlohmann::json(t.sizes().vec()).dump(); }

// The file that lists a checkpoint's tensors: its index, else model.safetensors.
fs::path listing_file(const std::string& path) {
  if (!fs::is_directory(path)) return path;
  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  return fs::exists(index) ? index : fs::path(path) / "model.safetensors";
}

// config.json must describe the model titan builds: shapes are checked per tensor on load; these
// change the numerics (or the model) without changing a shape.
void check_hf_config(const std::string& file, const model::ModelArgs& args) {
  std::ifstream in(file);
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("Hugging Face config '" + file + "' is not valid JSON: " + e.what());
  }
  auto differs = [&](const char* key, const nlohmann::json& ours) {
    if (!cfg.contains(key) || cfg[key].is_null()) return false;
    const nlohmann::json& theirs = cfg[key];
    if (theirs.is_number() && ours.is_number()) return theirs.get<double>() != ours.get<double>();
    return theirs != ours;
  };
  auto expect = [&](const char* key, const nlohmann::json& ours, const char* titan_key) {
    if (differs(key, ours))
      throw std::runtime_error("Hugging Face config '" + file + "' has " + key + " = " + cfg[key].dump() +
                               ", but titan's model has " + titan_key + " = " + ours.dump() +
                               ": choose the matching model.name and model.flavor");
  };
  expect("model_type", hf_architecture(args).second, "model_type");
  expect("hidden_size", args.dim, "dim");
  expect("num_hidden_layers", args.n_layers, "n_layers");
  expect("num_attention_heads", args.n_heads, "n_heads");
  expect("num_key_value_heads", args.kv_heads(), "n_kv_heads");
  expect("rope_theta", args.rope_theta, "rope_theta");
  expect("rms_norm_eps", args.norm_eps, "norm_eps");
  if (args.moe) {
    expect("num_experts", args.moe->num_experts, "num_experts");
    expect("num_experts_per_tok", args.moe->top_k, "top_k");
    expect("norm_topk_prob", args.moe->route_norm, "route_norm");
  }
  const nlohmann::json theirs = cfg.contains("rope_scaling") ? cfg["rope_scaling"] : nlohmann::json(nullptr);
  const nlohmann::json ours = hf_rope_scaling(args.rope_scaling);
  auto same_scaling = [&] {
    if (theirs.is_null() || ours.is_null()) return theirs.is_null() && ours.is_null();
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!theirs.contains(k) || theirs[k].get<double>() != ours[k].get<double>()) return false;
    return theirs.value("rope_type", std::string("llama3")) == "llama3";
  };
  if (!same_scaling())
    throw std::runtime_error("Hugging Face config '" + file + "' has rope_scaling " + theirs.dump() +
                             ", but titan's model has " + ours.dump() + ": choose the matching model.flavor");
}

}  // namespace

std::optional<std::string> hf_buffer_name(const std::string& fqn, const model::ModelArgs& args) {
  const std::optional<model::LayerPath> block = model::parse_layer_path(fqn);
  if (!block) return std::nullopt;
  for (const auto& [t, h] : block_buffer_names(args))
    if (block->rest == t) return hf_block_name(block->layer, h);
  return std::nullopt;
}

std::vector<std::string> hf_names(const std::string& fqn, const model::ModelArgs& args) {
  for (const auto& [t, h] : kTopNames)
    if (fqn == t) return {h};
  if (std::optional<std::string> buffer = hf_buffer_name(fqn, args)) return {*buffer};
  if (const std::optional<model::LayerPath> block = model::parse_layer_path(fqn)) {
    for (const auto& [t, h] : kBlockNames)
      if (block->rest == t) return {hf_block_name(block->layer, h)};
    for (const auto& [t, h] : kExpertNames)
      if (block->rest == t && args.moe) {
        std::vector<std::string> names;
        for (int64_t j = 0; j < args.moe->num_experts; ++j)
          names.push_back(hf_block_name(block->layer, "mlp.experts." + std::to_string(j) + "." + h));
        return names;
      }
  }
  throw std::invalid_argument("no Hugging Face name for titan parameter '" + fqn + "'");
}

TitanSlot titan_slot_from_hf(const std::string& hf, const model::ModelArgs& args) {
  if (hf == "lm_head.weight" && args.tie_embeddings) return {};  // HF ties it to the embedding too
  for (const auto& [t, h] : kTopNames)
    if (hf == h) return {t};
  if (const std::optional<model::LayerPath> block = model::parse_layer_path(hf, "model.layers.")) {
    const std::string& rest = block->rest;
    for (const auto& [t, h] : kBlockNames)
      if (rest == h) return {model::layer_path(block->layer, t)};
    for (const auto& [t, h] : block_buffer_names(args))
      if (rest == h) return {model::layer_path(block->layer, t)};
    if (rest == "self_attn.rotary_emb.inv_freq") return {};  // a buffer of older exports
    // "mlp.experts.<j>.<weight>": expert j's slice of the stacked experts tensor.
    if (const std::optional<model::LayerPath> expert = model::parse_layer_path(rest, "mlp.experts."))
      for (const auto& [t, h] : kExpertNames) {
        if (expert->rest != h) continue;
        const int64_t j = expert->layer;
        const int64_t experts = args.moe ? args.moe->num_experts : 0;
        if (j >= experts)
          throw std::invalid_argument("Hugging Face tensor '" + hf + "' is expert " + std::to_string(j) +
                                      ", but titan's model has " + std::to_string(experts) + " experts per layer");
        return {model::layer_path(block->layer, t), j};
      }
  }
  throw std::invalid_argument("Hugging Face tensor '" + hf + "' is not a Llama 3 or Qwen3 weight titan knows");
}

at::Tensor to_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  const int64_t heads = rotary_heads(fqn, args);
  if (heads == 0) return w;
  const int64_t hd = args.head_dim(), dim = w.size(1);
  return w.reshape({heads, hd / 2, 2, dim}).transpose(1, 2).reshape({heads * hd, dim}).contiguous();
}

at::Tensor from_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  const int64_t heads = rotary_heads(fqn, args);
  if (heads == 0) return w;
  const int64_t hd = args.head_dim(), dim = w.size(1);
  return w.reshape({heads, 2, hd / 2, dim}).transpose(1, 2).reshape({heads * hd, dim}).contiguous();
}

std::pair<std::string, std::string> hf_architecture(const model::ModelArgs& args) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("titan's " + args.family + " model has no Hugging Face counterpart: " + what);
  };
  if (args.family == "llama3") {
    if (args.qk_norm || args.rope_rotate_half || args.moe) refuse("Llama with q/k norms, half rotation or experts");
    return {"LlamaForCausalLM", "llama"};
  }
  if (args.family != "qwen3") refuse("only Llama 3 and Qwen3 are mapped");
  if (!args.qk_norm || !args.rope_rotate_half) refuse("Qwen3 without q/k norms or with interleaved rotation");
  if (!args.moe) return {"Qwen3ForCausalLM", "qwen3"};
  // HF's Qwen3-MoE block: softmax over every expert, the top k (renormalized by norm_topk_prob)
  // weighing the experts' outputs, nothing else.
  const model::moe::MoEArgs& m = *args.moe;
  if (m.score_func != "softmax") refuse("router score_func '" + m.score_func + "' (HF's is softmax)");
  if (m.num_shared_experts > 0) refuse("shared experts");
  if (m.gate_bias) refuse("a router gate bias");
  if (m.route_scale != 1.0) refuse("route_scale " + std::to_string(m.route_scale) + " (HF's is 1)");
  if (m.score_before_experts) refuse("scores applied before the experts (HF weighs their outputs)");
  if (m.num_expert_groups) refuse("group-limited routing");
  return {"Qwen3MoeForCausalLM", "qwen3_moe"};
}

nlohmann::json hf_config(const model::ModelArgs& args, at::ScalarType dtype) {
  const auto [architecture, model_type] = hf_architecture(args);
  nlohmann::json c = {
      {"architectures", {architecture}},
      {"model_type", model_type},
      {"hidden_size", args.dim},
      {"intermediate_size", args.ffn_hidden_dim()},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.kv_heads()},
      {"head_dim", args.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", hf_rope_scaling(args.rope_scaling)},
      {"max_position_embeddings", args.max_seq_len},
      {"vocab_size", args.vocab_size},
      {"tie_word_embeddings", args.tie_embeddings},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32")}};
  if (model_type == "llama") {
    c["mlp_bias"] = false;
    return c;
  }
  // Qwen3 attends over the whole causal window in every layer.
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = args.n_layers;
  if (!args.moe) return c;
  c["num_experts"] = args.moe->num_experts;
  c["num_experts_per_tok"] = args.moe->top_k;
  c["moe_intermediate_size"] = args.moe_hidden_dim;
  c["norm_topk_prob"] = args.moe->route_norm;
  // Every block's feed-forward is a mixture of experts.
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = nlohmann::json::array();
  // titan balances the experts' load with expert_bias, not with an auxiliary loss.
  c["router_aux_loss_coef"] = 0.0;
  c["output_router_logits"] = false;
  return c;
}

int64_t write_hf_folder(const std::string& dir, const std::vector<std::string>& fqns,
                        const std::vector<std::vector<int64_t>>& shapes, const model::ModelArgs& args,
                        at::ScalarType dtype, const std::function<at::Tensor(const std::string&)>& fetch,
                        bool writer, int64_t max_shard_bytes) {
  // Every name and the config before the first gather: a model HF cannot hold fails on every
  // rank alike, not on the writer alone in the middle of the collectives.
  const nlohmann::json config = hf_config(args, dtype);
  std::vector<std::vector<std::string>> names;
  for (const std::string& fqn : fqns) names.push_back(hf_names(fqn, args));
  // Shards are planned from the shapes, so every file name ("-of-K") is known up front; a
  // stacked expert weight's E tensors share one shard.
  std::vector<int> shard_of(fqns.size());
  int shards = 1;
  int64_t in_shard = 0, total = 0;
  // A buffer (the load-balancing bias) keeps float32 whatever the weights' dtype: its steps of
  // coeff are below bfloat16's resolution at the bias's size.
  auto dtype_of = [&](const std::string& fqn) { return hf_buffer_name(fqn, args) ? at::kFloat : dtype; };
  for (size_t i = 0; i < fqns.size(); ++i) {
    int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype_of(fqns[i])));
    for (int64_t d : shapes[i]) bytes *= d;
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      ++shards;
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
    shard_of[i] = shards;
  }
  auto file_name = [&](int s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s, shards);
    return std::string(name);
  };
  if (writer) fs::create_directories(dir);
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::pair<std::string, at::Tensor>> pending;
  int64_t written = 0;
  for (size_t i = 0; i < fqns.size(); ++i) {
    at::Tensor full = fetch(fqns[i]);  // every rank: may be a collective
    if (!writer) continue;
    const at::Tensor hf = to_hf_layout(fqns[i], full.to(at::kCPU).to(dtype_of(fqns[i])), args);
    const bool stacked = is_stacked_experts(fqns[i]);
    if (stacked && hf.size(0) != static_cast<int64_t>(names[i].size()))
      throw std::runtime_error("titan parameter '" + fqns[i] + "' stacks " + std::to_string(hf.size(0)) +
                               " experts, but the model has " + std::to_string(names[i].size()));
    for (size_t j = 0; j < names[i].size(); ++j) {
      pending.emplace_back(names[i][j], stacked ? hf.select(0, static_cast<int64_t>(j)).contiguous() : hf);
      weight_map[names[i][j]] = file_name(shard_of[i]);
    }
    if (i + 1 == fqns.size() || shard_of[i + 1] != shard_of[i]) {
      save_safetensors((fs::path(dir) / file_name(shard_of[i])).string(), pending, {{"format", "pt"}});
      for (const auto& p : pending) written += static_cast<int64_t>(p.second.nbytes());
      pending.clear();
    }
  }
  if (!writer) return 0;
  write_json_atomic(fs::path(dir) / "model.safetensors.index.json",
                    {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json_atomic(fs::path(dir) / "config.json", config);
  return written;
}

bool is_hf_checkpoint(const std::string& path) {
  if (fs::is_directory(path))
    return fs::exists(fs::path(path) / "model.safetensors.index.json") || fs::exists(fs::path(path) / "model.safetensors");
  const std::string name = fs::path(path).filename().string();
  return name.size() > 11 && name.compare(name.size() - 11, 11, ".index.json") == 0;
}

std::map<std::string, std::vector<std::string>> hf_checkpoint_files(const std::string& path) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path index = fs::is_directory(path) ? dir / "model.safetensors.index.json" : fs::path(path);
  std::map<std::string, std::vector<std::string>> by_file;
  if (!fs::exists(index)) {
    for (const auto& [name, entry] : read_safetensors_header((dir / "model.safetensors").string()))
      by_file["model.safetensors"].push_back(name);
    return by_file;
  }
  std::ifstream in(index);
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [name, file] : j.at("weight_map").items()) {
      const std::string f = file.get<std::string>();
      // A shard is a file next to the index: a name with a folder in it could read anything.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw std::runtime_error("tensor '" + name + "' names shard '" + f + "', which is not a file name in the folder");
      by_file[f].push_back(name);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("Hugging Face index '" + index.string() + "' is not valid: " + e.what());
  }
  return by_file;
}

void read_hf_checkpoint(const std::string& path, const model::ModelArgs& args,
                        const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (fs::exists(dir / "config.json")) check_hf_config((dir / "config.json").string(), args);
  // A stacked expert weight's experts, until all of them are read (they may span shards).
  struct Experts {
    std::vector<at::Tensor> rows;
    int64_t read = 0;
  };
  std::map<std::string, Experts> experts;
  const auto by_file = hf_checkpoint_files(path);  // read file by file
  for (const auto& [file, names] : by_file) {
    const std::string file_path = (dir / file).string();
    if (!fs::exists(file_path))
      throw std::runtime_error("Hugging Face checkpoint '" + path + "': shard '" + file_path + "' (holding '" +
                               names.front() + "') is missing");
    const auto entries = read_safetensors_header(file_path);
    std::ifstream in(file_path, std::ios::binary);
    for (const std::string& name : names) {
      const TitanSlot slot = titan_slot_from_hf(name, args);
      if (slot.fqn.empty()) continue;
      const auto e = entries.find(name);
      if (e == entries.end())
        throw std::runtime_error("Hugging Face shard '" + file_path + "' lacks tensor '" + name + "' (the index names it)");
      at::Tensor t = at::empty(e->second.shape, at::TensorOptions().dtype(e->second.dtype));
      in.seekg(e->second.begin);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      if (!in) throw std::runtime_error("Hugging Face shard '" + file_path + "': tensor '" + name + "' is truncated");
      if (slot.expert < 0) {
        visit(slot.fqn, from_hf_layout(slot.fqn, t.to(at::kFloat), args));
        continue;
      }
      Experts& x = experts[slot.fqn];
      if (x.rows.empty()) x.rows.resize(static_cast<size_t>(args.moe->num_experts));
      for (const at::Tensor& other : x.rows)
        if (other.defined() && other.sizes() != t.sizes())
          throw std::runtime_error("Hugging Face shard '" + file_path + "': tensor '" + name + "' has shape " +
                                   shape_text(t) + ", another expert of the same layer " + shape_text(other));
      x.rows[static_cast<size_t>(slot.expert)] = t.to(at::kFloat);
      if (++x.read == args.moe->num_experts) {
        visit(slot.fqn, at::stack(x.rows));
        experts.erase(slot.fqn);
      }
    }
  }
  for (const auto& [fqn, x] : experts) {  // some expert of a layer no file names
    const std::vector<std::string> hf = hf_names(fqn, args);
    for (size_t j = 0; j < x.rows.size(); ++j)
      if (!x.rows[j].defined())
        throw std::runtime_error("Hugging Face checkpoint '" + listing_file(path).string() + "' lacks tensor '" +
                                 hf[j] + "' (expert " + std::to_string(j) + " of titan's '" + fqn + "')");
  }
}

}  // namespace titan::trainer::checkpoint
