#include "trainer/checkpoint/hf_weights.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include "model/family.h"
#include "model/hf_format.h"
#include "model/param_path.h"
#include "trainer/checkpoint/safetensors.h"
#include "util/atomic_file.h"

namespace titan::trainer::checkpoint {
namespace fs = std::filesystem;
namespace {

using model::HfFormat;
using model::HfNamePair;

// The family's declaration of the model's Hugging Face format; throws std::invalid_argument
// where HF cannot hold the model.
HfFormat hf_format(const model::ModelArgs& args) {
  HfFormat f = model::family(args.family).hugging_face(args);
  if (args.mtp_layers > 0 && f.mtp_names.empty())
    model::refuse_hugging_face(args, "model.mtp_layers = " + std::to_string(args.mtp_layers) + " (" + f.architecture +
                                         " has no multi-token prediction blocks)");
  return f;
}

const HfNamePair* with_titan_name(const std::vector<HfNamePair>& pairs, const std::string& titan) {
  const auto it = std::find_if(pairs.begin(), pairs.end(), [&](const HfNamePair& p) { return p.titan == titan; });
  return it == pairs.end() ? nullptr : &*it;
}
const HfNamePair* with_hf_name(const std::vector<HfNamePair>& pairs, const std::string& hf) {
  const auto it = std::find_if(pairs.begin(), pairs.end(), [&](const HfNamePair& p) { return p.hf == hf; });
  return it == pairs.end() ? nullptr : &*it;
}
bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A block's parameter as HF numbers its blocks: "layers.<i>.<rest>" -> {i, rest}, a multi-token
// prediction depth's "mtp_layers.<k>.<rest>" -> {n_layers + k, rest} (See HfFormat::mtp_names).
struct HfBlock {
  int64_t layer = 0;
  std::string rest;
  bool mtp = false;
};
std::optional<HfBlock> hf_block_of(const std::string& fqn, const model::ModelArgs& args) {
  if (const std::optional<model::LayerPath> block = model::parse_layer_path(fqn)) return HfBlock{block->layer, block->rest};
  if (const std::optional<model::LayerPath> depth = model::parse_layer_path(fqn, model::kMtpLayersPrefix))
    return HfBlock{args.n_layers + depth->layer, depth->rest, true};
  return std::nullopt;
}
// The fused entry (HfFormat::fused_experts) holding titan parameter `fqn`, and its place in it.
struct FusedPart {
  const model::HfFusedExperts* entry = nullptr;
  size_t index = 0;
  int64_t layer = 0;
};
FusedPart fused_part(const HfFormat& f, const std::string& fqn, const model::ModelArgs& args) {
  const std::optional<HfBlock> block = hf_block_of(fqn, args);
  if (!block || !args.moe) return {};
  for (const model::HfFusedExperts& e : f.fused_experts)
    for (size_t i = 0; i < e.titan.size(); ++i)
      if (e.titan[i] == block->rest) return {&e, i, block->layer};
  return {};
}
// The fused entry HF tensor `rest` (after block_folder + "<i>.") is, or none.
const model::HfFusedExperts* fused_entry(const HfFormat& f, const std::string& rest) {
  const auto it = std::find_if(f.fused_experts.begin(), f.fused_experts.end(),
                               [&](const model::HfFusedExperts& e) { return e.hf == rest; });
  return it == f.fused_experts.end() ? nullptr : &*it;
}

// The titan path of HF block `layer`'s `rest`: a layer's, or a depth's past n_layers.
std::string titan_block_path(int64_t layer, const std::string& rest, const model::ModelArgs& args) {
  return layer < args.n_layers ? model::layer_path(layer, rest)
                               : model::layer_path(layer - args.n_layers, rest, model::kMtpLayersPrefix);
}

std::optional<std::string> buffer_name(const HfFormat& f, const std::string& fqn, const model::ModelArgs& args) {
  const std::optional<HfBlock> block = hf_block_of(fqn, args);
  if (!block) return std::nullopt;
  if (const HfNamePair* p = with_titan_name(f.block_buffer_names, block->rest))
    return model::layer_path(block->layer, p->hf, f.block_folder);
  return std::nullopt;
}

std::vector<std::string> names_of(const HfFormat& f, const std::string& fqn, const model::ModelArgs& args) {
  if (const HfNamePair* p = with_titan_name(f.top_names, fqn)) return {p->hf};
  if (std::optional<std::string> buffer = buffer_name(f, fqn, args)) return {*buffer};
  if (const std::optional<HfBlock> block = hf_block_of(fqn, args)) {
    if (const HfNamePair* p = block->mtp ? with_titan_name(f.mtp_names, block->rest) : nullptr)
      return {model::layer_path(block->layer, p->hf, f.block_folder)};
    if (const HfNamePair* p = with_titan_name(f.block_names, block->rest))
      return {model::layer_path(block->layer, p->hf, f.block_folder)};
    if (const FusedPart part = fused_part(f, fqn, args); part.entry)
      return {model::layer_path(block->layer, part.entry->hf, f.block_folder)};
    if (const HfNamePair* p = with_titan_name(f.expert_names, block->rest); p && args.moe) {
      std::vector<std::string> names;
      for (int64_t j = 0; j < args.moe->num_experts; ++j)
        names.push_back(model::layer_path(block->layer, model::layer_path(j, p->hf, f.expert_folder), f.block_folder));
      return names;
    }
  }
  throw std::invalid_argument("no Hugging Face name for titan parameter '" + fqn + "'");
}

TitanSlot slot_of(const HfFormat& f, const std::string& hf, const model::ModelArgs& args) {
  if (listed(f.ignored_names, hf)) return {};
  if (const HfNamePair* p = with_hf_name(f.top_names, hf)) return {p->titan};
  if (const std::optional<model::LayerPath> block = model::parse_layer_path(hf, f.block_folder)) {
    const std::string& rest = block->rest;
    const auto titan = [&](const std::string& titan_rest) { return titan_block_path(block->layer, titan_rest, args); };
    if (block->layer >= args.n_layers && !f.mtp_names.empty()) {
      // A multi-token prediction depth's block: its copies of the embedding and head are the
      // model's; the depths titan does not train are skipped.
      if (block->layer >= args.n_layers + args.mtp_layers || listed(f.mtp_ignored_names, rest)) return {};
      if (const HfNamePair* p = with_hf_name(f.mtp_names, rest)) return {titan(p->titan)};
    }
    if (const HfNamePair* p = with_hf_name(f.block_names, rest)) return {titan(p->titan)};
    if (const HfNamePair* p = with_hf_name(f.block_buffer_names, rest)) return {titan(p->titan)};
    if (listed(f.ignored_block_names, rest)) return {};
    // A fused experts tensor holds several parameters (read_hf_checkpoint splits it): its first.
    if (const model::HfFusedExperts* e = fused_entry(f, rest)) return {titan(e->titan.front())};
    // Expert j's slice of a stacked experts tensor.
    if (const std::optional<model::LayerPath> expert = model::parse_layer_path(rest, f.expert_folder))
      if (const HfNamePair* p = with_hf_name(f.expert_names, expert->rest)) {
        const int64_t j = expert->layer;
        const int64_t experts = args.moe ? args.moe->num_experts : 0;
        if (j >= experts)
          throw std::invalid_argument("Hugging Face tensor '" + hf + "' is expert " + std::to_string(j) +
                                      ", but titan's model has " + std::to_string(experts) + " experts per layer");
        return {titan(p->titan), j};
      }
    for (const model::HfRefusedName& refused : f.refused_block_names)
      if (refused.hf == rest) throw std::invalid_argument("Hugging Face tensor '" + hf + "' is " + refused.why);
  }
  throw std::invalid_argument("Hugging Face tensor '" + hf + "' is not a " + f.model_type + " weight titan knows");
}

// A stacked experts weight: E experts' weights in one [E, ...] tensor.
bool is_stacked_experts(const HfFormat& f, const std::string& fqn, const model::ModelArgs& args) {
  const std::optional<HfBlock> block = hf_block_of(fqn, args);
  return block && with_titan_name(f.expert_names, block->rest) != nullptr;
}

// The rows of `fqn` HF holds permuted, or none.
const model::HfRotaryRows* rotary_rows(const HfFormat& f, const std::string& fqn, const model::ModelArgs& args) {
  const std::optional<HfBlock> block = hf_block_of(fqn, args);
  if (!block) return nullptr;
  const auto it = std::find_if(f.rotary_rows.begin(), f.rotary_rows.end(),
                               [&](const model::HfRotaryRows& r) { return r.titan == block->rest; });
  return it == f.rotary_rows.end() ? nullptr : &*it;
}

at::Tensor to_layout(const HfFormat& f, const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  if (fused_part(f, fqn, args).entry) return w.transpose(-1, -2).contiguous();  // [E, N, K] -> [E, K, N]
  const model::HfRotaryRows* r = rotary_rows(f, fqn, args);
  if (!r) return w;
  const int64_t dim = w.size(1);
  return w.reshape({r->heads, r->head_dim / 2, 2, dim}).transpose(1, 2).reshape({r->heads * r->head_dim, dim})
      .contiguous();
}

at::Tensor from_layout(const HfFormat& f, const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  if (fused_part(f, fqn, args).entry) return w.transpose(-1, -2).contiguous();  // [E, K, N] -> [E, N, K]
  const model::HfRotaryRows* r = rotary_rows(f, fqn, args);
  if (!r) return w;
  const int64_t dim = w.size(1);
  return w.reshape({r->heads, 2, r->head_dim / 2, dim}).transpose(1, 2).reshape({r->heads * r->head_dim, dim})
      .contiguous();
}

nlohmann::json config_of(const HfFormat& f, at::ScalarType dtype) {
  nlohmann::json c = f.config;
  c["architectures"] = {f.architecture};
  c["model_type"] = f.model_type;
  c["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32");
  return c;
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

// Whether config.json's `theirs` is titan's `ours`: numbers by value, objects by ours' keys
// (theirs may leave out `optional_keys`, and may hold more).
bool same_value(const nlohmann::json& theirs, const nlohmann::json& ours,
                const std::vector<std::string>& optional_keys) {
  if (theirs.is_number() && ours.is_number()) return theirs.get<double>() == ours.get<double>();
  if (!theirs.is_object() || !ours.is_object()) return theirs == ours;
  for (const auto& [key, value] : ours.items()) {
    if (!theirs.contains(key)) {
      if (listed(optional_keys, key)) continue;
      return false;
    }
    if (!same_value(theirs[key], value, {})) return false;
  }
  return true;
}

// config.json must describe the model titan builds (the format's config_checks, after its
// model_type).
void check_hf_config(const std::string& file, const HfFormat& f) {
  std::ifstream in(file);
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("Hugging Face config '" + file + "' is not valid JSON: " + e.what());
  }
  std::vector<model::HfConfigCheck> checks = {model::hf_value_check("model_type", f.model_type, "model_type")};
  checks.insert(checks.end(), f.config_checks.begin(), f.config_checks.end());
  for (const model::HfConfigCheck& check : checks) {
    const bool given = cfg.contains(check.key) && !cfg[check.key].is_null();
    if (!given && !check.absent_is_null) continue;
    const nlohmann::json theirs = given ? cfg[check.key] : nlohmann::json(nullptr);
    if (same_value(theirs, check.ours, check.optional_keys)) continue;
    const std::string what = check.titan_key.empty()
                                 ? check.key + " " + theirs.dump() + ", but titan's model has " + check.ours.dump()
                                 : check.key + " = " + theirs.dump() + ", but titan's model has " + check.titan_key +
                                       " = " + check.ours.dump();
    throw std::runtime_error("Hugging Face config '" + file + "' has " + what + ": choose the matching " +
                             check.choose);
  }
}

}  // namespace

std::optional<std::string> hf_buffer_name(const std::string& fqn, const model::ModelArgs& args) {
  std::optional<HfFormat> f;
  try {
    f = hf_format(args);
  } catch (const std::invalid_argument&) {  // no HF counterpart: no buffer either
    return std::nullopt;
  }
  return buffer_name(*f, fqn, args);
}

std::vector<std::string> hf_names(const std::string& fqn, const model::ModelArgs& args) {
  return names_of(hf_format(args), fqn, args);
}

TitanSlot titan_slot_from_hf(const std::string& hf, const model::ModelArgs& args) {
  return slot_of(hf_format(args), hf, args);
}

at::Tensor to_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  return to_layout(hf_format(args), fqn, w, args);
}

at::Tensor from_hf_layout(const std::string& fqn, const at::Tensor& w, const model::ModelArgs& args) {
  return from_layout(hf_format(args), fqn, w, args);
}

std::pair<std::string, std::string> hf_architecture(const model::ModelArgs& args) {
  const HfFormat f = hf_format(args);
  return {f.architecture, f.model_type};
}

nlohmann::json hf_config(const model::ModelArgs& args, at::ScalarType dtype) {
  return config_of(hf_format(args), dtype);
}

int64_t write_hf_folder(const std::string& dir, const std::vector<std::string>& fqns,
                        const std::vector<std::vector<int64_t>>& shapes, const model::ModelArgs& args,
                        at::ScalarType dtype, const std::function<at::Tensor(const std::string&)>& fetch,
                        bool writer, int64_t max_shard_bytes) {
  // Every name and the config before the first gather: a model HF cannot hold fails on every
  // rank alike, not on the writer alone in the middle of the collectives.
  const HfFormat format = hf_format(args);
  const nlohmann::json config = config_of(format, dtype);
  std::vector<std::vector<std::string>> names;
  for (const std::string& fqn : fqns) names.push_back(names_of(format, fqn, args));
  // Shards are planned from the shapes, so every file name ("-of-K") is known up front; a
  // stacked expert weight's E tensors share one shard.
  std::vector<int> shard_of(fqns.size());
  int shards = 1;
  int64_t in_shard = 0, total = 0;
  // A buffer (the load-balancing bias) keeps float32 whatever the weights' dtype: its steps of
  // coeff are below bfloat16's resolution at the bias's size.
  auto dtype_of = [&](const std::string& fqn) { return buffer_name(format, fqn, args) ? at::kFloat : dtype; };
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
  // A fused experts tensor's parts until the last arrives (HfFormat::fused_experts); it goes into
  // that part's shard.
  std::map<std::string, std::vector<at::Tensor>> fused;
  int64_t written = 0;
  for (size_t i = 0; i < fqns.size(); ++i) {
    at::Tensor full = fetch(fqns[i]);  // every rank: may be a collective
    if (!writer) continue;
    const at::Tensor hf = to_layout(format, fqns[i], full.to(at::kCPU).to(dtype_of(fqns[i])), args);
    const bool stacked = is_stacked_experts(format, fqns[i], args);
    if (stacked && hf.size(0) != static_cast<int64_t>(names[i].size()))
      throw std::runtime_error("titan parameter '" + fqns[i] + "' stacks " + std::to_string(hf.size(0)) +
                               " experts, but the model has " + std::to_string(names[i].size()));
    if (const FusedPart part = fused_part(format, fqns[i], args); part.entry) {
      std::vector<at::Tensor>& parts = fused[names[i][0]];
      parts.resize(part.entry->titan.size());
      parts[part.index] = hf;
      if (std::all_of(parts.begin(), parts.end(), [](const at::Tensor& t) { return t.defined(); })) {
        pending.emplace_back(names[i][0], at::cat(parts, -1));
        weight_map[names[i][0]] = file_name(shard_of[i]);
        fused.erase(names[i][0]);
      }
    } else {
      for (size_t j = 0; j < names[i].size(); ++j) {
        pending.emplace_back(names[i][j], stacked ? hf.select(0, static_cast<int64_t>(j)).contiguous() : hf);
        weight_map[names[i][j]] = file_name(shard_of[i]);
      }
    }
    if (i + 1 == fqns.size() || shard_of[i + 1] != shard_of[i]) {
      save_safetensors((fs::path(dir) / file_name(shard_of[i])).string(), pending, {{"format", "pt"}});
      for (const auto& p : pending) written += static_cast<int64_t>(p.second.nbytes());
      pending.clear();
    }
  }
  if (!writer) return 0;
  if (!fused.empty())
    throw std::logic_error("write_hf_folder: Hugging Face tensor '" + fused.begin()->first +
                           "' fuses parameters that are not all among the exported ones");
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
  const HfFormat format = hf_format(args);
  if (fs::exists(dir / "config.json")) check_hf_config((dir / "config.json").string(), format);
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
      const TitanSlot slot = slot_of(format, name, args);
      if (slot.fqn.empty()) continue;
      const std::optional<model::LayerPath> block = model::parse_layer_path(name, format.block_folder);
      const model::HfFusedExperts* fused = block ? fused_entry(format, block->rest) : nullptr;
      const auto e = entries.find(name);
      if (e == entries.end())
        throw std::runtime_error("Hugging Face shard '" + file_path + "' lacks tensor '" + name + "' (the index names it)");
      at::Tensor t = at::empty(e->second.shape, at::TensorOptions().dtype(e->second.dtype));
      in.seekg(e->second.begin);
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      if (!in) throw std::runtime_error("Hugging Face shard '" + file_path + "': tensor '" + name + "' is truncated");
      if (fused) {  // one tensor of several parameters: split along its last dim, equal parts
        const int64_t parts = static_cast<int64_t>(fused->titan.size());
        if (t.dim() != 3 || t.size(-1) % parts != 0)
          throw std::runtime_error("Hugging Face shard '" + file_path + "': tensor '" + name + "' has shape " +
                                   shape_text(t) + ", not [experts, in, " + std::to_string(parts) + " x out]");
        const std::vector<at::Tensor> split = t.to(at::kFloat).chunk(parts, -1);
        for (int64_t i = 0; i < parts; ++i) {
          const std::string fqn = titan_block_path(block->layer, fused->titan[static_cast<size_t>(i)], args);
          visit(fqn, from_layout(format, fqn, split[static_cast<size_t>(i)], args));
        }
        continue;
      }
      if (slot.expert < 0) {
        visit(slot.fqn, from_layout(format, slot.fqn, t.to(at::kFloat), args));
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
    const std::vector<std::string> hf = names_of(format, fqn, args);
    for (size_t j = 0; j < x.rows.size(); ++j)
      if (!x.rows[j].defined())
        throw std::runtime_error("Hugging Face checkpoint '" + listing_file(path).string() + "' lacks tensor '" +
                                 hf[j] + "' (expert " + std::to_string(j) + " of titan's '" + fqn + "')");
  }
}

}  // namespace titan::trainer::checkpoint
