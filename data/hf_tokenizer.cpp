#include "data/hf_tokenizer.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace titan::data {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// take code points 256, 257, ... in byte order, so every byte has a visible character.
const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else {  // the alphabet stays below U+0800: two bytes
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error("tokenizer " + file + ": " + what);
}

// j[key] for reading: null when j is not an object or has no such key. (nlohmann's const
// operator[] with a missing key is undefined behaviour, an assertion in debug builds: found by
// fuzz/fuzz_hf_tokenizer.cpp.)
const json& field(const json& j, const char* key) {
  static const json null;
  if (!j.is_object()) return null;
  const auto it = j.find(key);
  return it == j.end() ? null : *it;
}

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), "cannot be opened");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path.string(), std::string("is not valid JSON: ") + e.what());
  }
}

// A tokenizer_config.json token entry: "text" or {"content": "text", ...}.
std::string token_text(const json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_object() && entry.contains("content")) return field(entry, "content").get<std::string>();
  return "";
}

// The split regex and ByteLevel settings of tokenizer.json's pre_tokenizer.
std::string split_pattern_of(const json& pre, const std::string& file) {
  static const char* kGpt2Pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  auto check_byte_level = [&](const json& p, bool may_split) {
    if (p.value("add_prefix_space", false)) {
      fail(file, "titan does not implement ByteLevel add_prefix_space = true yet");
    }
    if (!may_split && p.value("use_regex", true)) {
      fail(file, "a Split pre-tokenizer followed by ByteLevel with use_regex = true splits "
                 "twice; titan does not implement that yet");
    }
  };
  if (pre.is_null()) fail(file, "has no pre_tokenizer; titan reads byte-level BPE tokenizers");
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    check_byte_level(pre, true);
    if (!pre.value("use_regex", true)) fail(file, "ByteLevel without a regex splits nothing");
    return kGpt2Pattern;
  }
  if (type == "Sequence" && field(pre, "pretokenizers").is_array() && field(pre, "pretokenizers").size() == 2) {
    const json& split = field(pre, "pretokenizers")[0];
    const json& byte_level = field(pre, "pretokenizers")[1];
    if (split.value("type", "") == "Split" && byte_level.value("type", "") == "ByteLevel" &&
        field(split, "pattern").contains("Regex") && split.value("behavior", "") == "Isolated" &&
        !split.value("invert", false)) {
      check_byte_level(byte_level, false);
      return field(field(split, "pattern"), "Regex").get<std::string>();
    }
  }
  fail(file, "titan does not implement this pre_tokenizer yet (" + pre.dump().substr(0, 200) +
                 "); it reads Split(Regex, Isolated) + ByteLevel, or ByteLevel");
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(byte_to_code_point()[b], &out);
  return out;
}

bool byte_level_to_bytes(std::string_view text, std::string* bytes) {
  static const std::array<int, 324> code_point_to_byte = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_code_point()[b]] = b;
    return t;
  }();
  bytes->clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    uint32_t cp = 0;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = (c & 0x1Fu) << 6 | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu), i += 2;
    } else {
      return false;
    }
    if (cp >= code_point_to_byte.size() || code_point_to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(code_point_to_byte[cp]));
  }
  return true;
}

namespace {
std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::string& file, const std::filesystem::path& json_path,
                                                     const json& doc);
}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path json_path = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::exists(json_path, ec)) {
    throw std::runtime_error("no tokenizer.json at " + json_path.string() +
                             " (model.hf_assets_path names a folder of Hugging Face assets "
                             "holding tokenizer.json; titan ships none)");
  }
  const std::string file = json_path.string();
  // Any field of the wrong JSON type (found by fuzz/fuzz_hf_tokenizer.cpp: a document that is
  // not an object, an id that is a string, ...) is one error naming the file, not nlohmann's.
  try {
    return load_hf_tokenizer_json(file, json_path, read_json(json_path));
  } catch (const json::exception& e) {
    fail(file, std::string("malformed tokenizer.json (a field has the wrong type or is missing): ") + e.what());
  }
}

namespace {
std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::string& file, const std::filesystem::path& json_path,
                                                     const json& doc) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const json& model = field(doc, "model");
  if (!model.is_object() || model.value("type", "BPE") != "BPE") {
    fail(file, "titan reads BPE tokenizers; model.type is " +
                   (model.is_object() ? model.value("type", "?") : std::string("missing")));
  }
  if (!field(doc, "normalizer").is_null()) {
    fail(file, "titan does not implement tokenizer.json normalizers yet (normalizer = " +
                   field(doc, "normalizer").value("type", "?") + ")");
  }

  BpeVocabulary vocab;
  vocab.specials.clear();
  const json& entries = field(model, "vocab");
  if (!entries.is_object() || entries.empty()) fail(file, "model.vocab is missing or empty");
  vocab.tokens.resize(entries.size());
  std::vector<bool> seen(entries.size(), false);
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(entries.size()) || seen[id]) {
      fail(file, "model.vocab ids must be 0.." + std::to_string(entries.size() - 1) +
                     " each once; '" + it.key() + "' has id " + std::to_string(id));
    }
    seen[id] = true;
    if (!byte_level_to_bytes(it.key(), &vocab.tokens[id])) {
      fail(file, "model.vocab token '" + it.key() + "' is not in the byte-level alphabet");
    }
  }

  // Added tokens after the vocabulary are the special tokens, in id order.
  std::map<int64_t, std::string> added;
  for (const json& t : doc.value("added_tokens", json::array())) {
    const int64_t id = field(t, "id").get<int64_t>();
    if (id >= static_cast<int64_t>(vocab.tokens.size())) added[id] = field(t, "content").get<std::string>();
  }
  int64_t expected = static_cast<int64_t>(vocab.tokens.size());
  for (auto& [id, content] : added) {
    if (id != expected) {
      fail(file, "added token ids must follow the vocabulary without gaps; id " +
                     std::to_string(expected) + " is missing");
    }
    vocab.specials.push_back(std::move(content));
    ++expected;
  }

  // Merges: their order is the priority.
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) ids.emplace(vocab.tokens[i], static_cast<int32_t>(i));
  int32_t priority = 0;
  for (const json& m : model.value("merges", json::array())) {
    std::string left_text, right_text;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) fail(file, "merge '" + s + "' is not 'left right'");
      left_text = s.substr(0, space), right_text = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {
      left_text = m[0].get<std::string>(), right_text = m[1].get<std::string>();
    } else {
      fail(file, "a merge is neither 'left right' nor [left, right]: " + m.dump());
    }
    std::string left, right;
    if (!byte_level_to_bytes(left_text, &left) || !byte_level_to_bytes(right_text, &right)) {
      fail(file, "merge '" + left_text + " " + right_text + "' is not in the byte-level alphabet");
    }
    auto l = ids.find(left), r = ids.find(right), lr = ids.find(left + right);
    if (l == ids.end() || r == ids.end() || lr == ids.end()) {
      fail(file, "merge '" + left_text + " " + right_text + "' names a token not in model.vocab");
    }
    vocab.merges.emplace(static_cast<uint64_t>(l->second) << 32 | static_cast<uint32_t>(r->second),
                         priority++);
  }
  if (vocab.merges.empty()) fail(file, "model.merges is empty");
  vocab.whole_piece_first = model.value("ignore_merges", false);
  vocab.split_pattern = split_pattern_of(field(doc, "pre_tokenizer"), file);

  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    const json config = read_json(config_path);
    if (config.contains("bos_token")) vocab.bos = token_text(field(config, "bos_token"));
    if (config.contains("eos_token")) vocab.eos = token_text(field(config, "eos_token"));
  }
  return std::make_unique<BpeTokenizer>(std::move(vocab), file);
}
}  // namespace

}  // namespace titan::data
