#include "data/tokenizer.h"

#include <filesystem>
#include <stdexcept>

#include "data/bpe_tokenizer.h"
#include "data/hf_tokenizer.h"

namespace titan::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (bos) ids.push_back(kBosId);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  if (eos) ids.push_back(kEosId);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (id == kBosId) {
      out += "<|begin_of_text|>";
    } else if (id == kEosId) {
      out += "<|end_of_text|>";
    } else {
      throw std::runtime_error("byte-level tokenizer: cannot decode id " + std::to_string(id) +
                               " (valid ids are 0..257: bytes, BOS 256, EOS 257)");
    }
  }
  return out;
}

std::string ByteTokenizer::describe() const {
  return "byte-level tokenizer (vocab 258: bytes 0..255, BOS 256, EOS 257)";
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& path) {
  if (path.empty()) return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    if (std::filesystem::exists(p / "tokenizer.json", ec)) return load_hf_tokenizer(path);
    throw std::runtime_error("tokenizer path '" + path +
                             "' is a directory without tokenizer.json; pass a folder of Hugging "
                             "Face assets, the tiktoken file itself (e.g. " + path +
                             "/original/tokenizer.model), or \"\" for the byte-level tokenizer");
  }
  if (!std::filesystem::exists(p, ec)) {
    throw std::runtime_error("tokenizer path '" + path + "' does not exist (model.tokenizer_path, "
                             "or model.hf_assets_path: a tiktoken file, a tokenizer.json, or a "
                             "folder of Hugging Face assets holding tokenizer.json; titan ships "
                             "none; \"\" = the byte-level tokenizer)");
  }
  if (p.extension() == ".json") return load_hf_tokenizer(path);
  return BpeTokenizer::load(path);
}

}  // namespace titan::data
