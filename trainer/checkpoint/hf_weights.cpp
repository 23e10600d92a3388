#include "trainer/checkpoint/hf_weights.h"

#include <ATen/ops/empty.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

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
const std::vector<std::pair<std::string, std::string>> kBlockNames = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
};
const std::vector<std::pair<std::string, std::string>> kTopNames = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "layers.12.rest" -> ("12", "rest") for prefix "layers."; false otherwise.
bool split_layer(const std::string& name, const std::string& prefix, std::string* layer, std::string* rest) {
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  *layer = name.substr(prefix.size(), dot - prefix.size());
  *rest = name.substr(dot + 1);
  return !layer->empty() && layer->find_first_not_of("0123456789") == std::string::npos;
}

// Heads of wq / wk (0: not a rotary projection).
int64_t rotary_heads(const std::string& fqn, const model::ModelArgs& args) {
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

}  // namespace

std::string hf_name(const std::string& fqn) {
  for (const auto& [t, h] : kTopNames)
    if (fqn == t) return h;
  std::string layer, rest;
  if (split_layer(fqn, "layers.", &layer, &rest))
    for (const auto& [t, h] : kBlockNames)
      if (rest == t) return "model.layers." + layer + "." + h;
  throw std::invalid_argument("no Hugging Face name for titan parameter '" + fqn + "'");
}

std::string titan_name_from_hf(const std::string& hf) {
  for (const auto& [t, h] : kTopNames)
    if (hf == h) return t;
  std::string layer, rest;
  if (split_layer(hf, "model.layers.", &layer, &rest)) {
    for (const auto& [t, h] : kBlockNames)
      if (rest == h) return "layers." + layer + "." + t;
    if (rest == "self_attn.rotary_emb.inv_freq") return "";  // a buffer of older exports
  }
  throw std::invalid_argument("Hugging Face tensor '" + hf + "' is not a Llama weight titan knows");
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

nlohmann::json hf_config(const model::ModelArgs& args, at::ScalarType dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
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
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32")}};
}

int64_t write_hf_folder(const std::string& dir, const std::vector<std::string>& fqns,
                        const std::vector<std::vector<int64_t>>& shapes, const model::ModelArgs& args,
                        at::ScalarType dtype, const std::function<at::Tensor(const std::string&)>& fetch,
                        bool writer, int64_t max_shard_bytes) {
  // Shards are planned from the shapes, so every file name ("-of-K") is known up front.
  std::vector<int> shard_of(fqns.size());
  int shards = 1;
  int64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < fqns.size(); ++i) {
    int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
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
    const std::string name = hf_name(fqns[i]);
    pending.emplace_back(name, to_hf_layout(fqns[i], full.to(at::kCPU).to(dtype), args));
    weight_map[name] = file_name(shard_of[i]);
    if (i + 1 == fqns.size() || shard_of[i + 1] != shard_of[i]) {
      save_safetensors((fs::path(dir) / file_name(shard_of[i])).string(), pending, {{"format", "pt"}});
      for (const auto& p : pending) written += static_cast<int64_t>(p.second.nbytes());
      pending.clear();
    }
  }
  if (!writer) return 0;
  write_json_atomic(fs::path(dir) / "model.safetensors.index.json",
                    {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json_atomic(fs::path(dir) / "config.json", hf_config(args, dtype));
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
  fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  // config.json, when present, must describe the model titan builds (shapes are checked per
  // tensor on load; these change the numerics without changing a shape).
  if (fs::exists(dir / "config.json")) {
    std::ifstream in(dir / "config.json");
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw std::runtime_error("Hugging Face config '" + (dir / "config.json").string() + "' is not valid JSON: " + e.what());
    }
    auto expect = [&](const char* key, double titan, const char* titan_key) {
      if (cfg.contains(key) && cfg[key].is_number() && cfg[key].get<double>() != titan)
        throw std::runtime_error("Hugging Face config '" + (dir / "config.json").string() + "' has " + key + " = " +
                                 cfg[key].dump() + ", but titan's model has " + titan_key + " = " +
                                 nlohmann::json(titan).dump() + ": choose the matching model.flavor");
    };
    expect("hidden_size", static_cast<double>(args.dim), "dim");
    expect("num_hidden_layers", static_cast<double>(args.n_layers), "n_layers");
    expect("num_attention_heads", static_cast<double>(args.n_heads), "n_heads");
    expect("num_key_value_heads", static_cast<double>(args.kv_heads()), "n_kv_heads");
    expect("rope_theta", args.rope_theta, "rope_theta");
    expect("rms_norm_eps", args.norm_eps, "norm_eps");
    const nlohmann::json theirs = cfg.contains("rope_scaling") ? cfg["rope_scaling"] : nlohmann::json(nullptr);
    const nlohmann::json ours = hf_rope_scaling(args.rope_scaling);
    auto same_scaling = [&] {
      if (theirs.is_null() || ours.is_null()) return theirs.is_null() && ours.is_null();
      for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (!theirs.contains(k) || theirs[k].get<double>() != ours[k].get<double>()) return false;
      return theirs.value("rope_type", std::string("llama3")) == "llama3";
    };
    if (!same_scaling())
      throw std::runtime_error("Hugging Face config '" + (dir / "config.json").string() + "' has rope_scaling " +
                               theirs.dump() + ", but titan's model has " + ours.dump() +
                               ": choose the matching model.flavor");
  }
  const auto by_file = hf_checkpoint_files(path);  // read file by file
  for (const auto& [file, names] : by_file) {
    const std::string file_path = (dir / file).string();
    if (!fs::exists(file_path))
      throw std::runtime_error("Hugging Face checkpoint '" + path + "': shard '" + file_path + "' (holding '" +
                               names.front() + "') is missing");
    const auto entries = read_safetensors_header(file_path);
    std::ifstream in(file_path, std::ios::binary);
    for (const std::string& name : names) {
      const std::string fqn = titan_name_from_hf(name);
      if (fqn.empty()) continue;
      const auto e = entries.find(name);
      if (e == entries.end())
        throw std::runtime_error("Hugging Face shard '" + file_path + "' lacks tensor '" + name + "' (the index names it)");
      at::Tensor t = at::empty(e->second.shape, at::TensorOptions().dtype(e->second.dtype));
      in.seekg(e->second.begin);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      if (!in) throw std::runtime_error("Hugging Face shard '" + file_path + "': tensor '" + name + "' is truncated");
      visit(fqn, from_hf_layout(fqn, t.to(at::kFloat), args));
    }
  }
}

}  // namespace titan::trainer::checkpoint
