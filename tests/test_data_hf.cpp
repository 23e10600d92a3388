// Hugging Face tokenizer.json (data/hf_tokenizer.h): a tokenizer.json written the way
// Hugging Face converts a tiktoken vocabulary (byte-level strings, every two-token split of a
// token as a merge, ordered by the merged token's rank; specials as added tokens) gives the
// same ids as the tiktoken path on the same vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/bpe_train.h"
#include "data/hf_tokenizer.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"
#include "temp_dir.h"

using namespace titan::data;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kCorpus =
    "The quick brown fox jumps over the lazy dog. It's 2024; numbers 12345 and 1,000,000!\n"
    "Ünïcödé wörds, ĉapital ĈASES, 日本語のテキスト, emoji 🙂🙂 and    spaces\t\ttabs.\n"
    "the the the they them then there their theirs thermal thermos thesis\n";

// Writes tokenizer.json + tokenizer_config.json for `tokens` (index = rank) into `dir`.
void write_hf_assets(const fs::path& dir, const std::vector<std::string>& tokens,
                     bool ignore_merges, bool merges_as_pairs) {
  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[bytes_to_byte_level(tokens[id])] = id;
  std::vector<std::tuple<size_t, size_t, size_t>> splits;  // merged rank, left id, right id
  auto id_of = [&](const std::string& t) {
    return std::find(tokens.begin(), tokens.end(), t) - tokens.begin();
  };
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    const std::string& t = tokens[rank];
    for (size_t i = 1; i < t.size(); ++i) {
      const size_t l = id_of(t.substr(0, i)), r = id_of(t.substr(i));
      if (l < tokens.size() && r < tokens.size()) splits.emplace_back(rank, l, r);
    }
  }
  std::sort(splits.begin(), splits.end());
  json merges = json::array();
  for (const auto& [rank, l, r] : splits) {
    const std::string a = bytes_to_byte_level(tokens[l]), b = bytes_to_byte_level(tokens[r]);
    merges.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  }
  json added = json::array();
  const std::vector<std::string> specials = llama3_special_tokens();
  for (size_t i = 0; i < specials.size(); ++i) {
    added.push_back({{"id", tokens.size() + i}, {"content", specials[i]}, {"special", true}});
  }
  const json doc = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", kLlama3SplitPattern}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", true},
                       {"use_regex", false}}})}}},
      {"model",
       {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merges}}},
  };
  std::ofstream(dir / "tokenizer.json") << doc.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"bos_token", "<|begin_of_text|>"},
              {"eos_token", {{"content", "<|end_of_text|>"}, {"special", true}}}}
             .dump();
}

}  // namespace

TEST_CASE("byte-level alphabet round trip", "[data][hf]") {
  CHECK(bytes_to_byte_level(" ") == "\xC4\xA0");  // 'Ġ' = U+0120
  CHECK(bytes_to_byte_level("\n") == "\xC4\x8A");  // 'Ċ' = U+010A
  CHECK(bytes_to_byte_level("a!") == "a!");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  REQUIRE(byte_level_to_bytes(bytes_to_byte_level(all), &back));
  CHECK(back == all);
  CHECK_FALSE(byte_level_to_bytes("\xE6\x97\xA5", &back));  // '日' is not in the alphabet
}

TEST_CASE("tokenizer.json gives the same ids as tiktoken on the same vocabulary", "[data][hf]") {
  const std::vector<std::string> tokens = train_bpe(kCorpus, 300);
  REQUIRE(tokens.size() > 350);  // 256 bytes + the merges this small corpus has
  const BpeTokenizer tiktoken(tokens, "test vocabulary");
  const fs::path dir = titan::testing::fresh_temp_dir("hf_tokenizer");
  for (const bool ignore_merges : {true, false}) {
    for (const bool pairs : {false, true}) {
      INFO("ignore_merges " << ignore_merges << ", merges as pairs " << pairs);
      write_hf_assets(dir, tokens, ignore_merges, pairs);
      const std::unique_ptr<Tokenizer> hf = make_tokenizer(dir.string());
      CHECK(hf->vocab_size() == tiktoken.vocab_size());
      CHECK(hf->bos_id() == tiktoken.bos_id());
      CHECK(hf->eos_id() == tiktoken.eos_id());
      for (const std::string& text :
           {std::string(kCorpus), std::string("thermos the"), std::string(""),
            std::string("unseen Wörter 987654 \xF0\x9F\x99\x82 <|end_of_text|>"),
            std::string("bad utf-8 \xFF\xFE here")}) {
        INFO(text);
        const std::vector<int32_t> ids = hf->encode(text, true, true);
        CHECK(ids == tiktoken.encode(text, true, true));
        CHECK(hf->decode(std::vector<int32_t>(ids.begin() + 1, ids.end() - 1)) == text);
      }
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("tokenizer.json: BOS/EOS from tokenizer_config.json, errors name the file", "[data][hf]") {
  const std::vector<std::string> tokens = train_bpe(kCorpus, 50);
  const fs::path dir = titan::testing::fresh_temp_dir("hf_tokenizer_errors");
  write_hf_assets(dir, tokens, true, false);
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}.dump();
  const auto hf = load_hf_tokenizer((dir / "tokenizer.json").string());
  CHECK(hf->eos_id() == hf->special_token_id("<|eot_id|>"));
  CHECK_THAT(hf->describe(), Catch::Matchers::Contains("EOS " + std::to_string(hf->eos_id())));

  json doc = json::parse(std::ifstream(dir / "tokenizer.json"));
  doc["normalizer"] = {{"type", "NFC"}};
  std::ofstream(dir / "tokenizer.json") << doc.dump();
  CHECK_THROWS_WITH(load_hf_tokenizer(dir.string()),
                    Catch::Matchers::Contains("tokenizer.json") &&
                        Catch::Matchers::Contains("titan does not implement tokenizer.json "
                                                  "normalizers yet (normalizer = NFC)"));
  fs::remove(dir / "tokenizer.json");
  CHECK_THROWS_WITH(make_tokenizer(dir.string()),
                    Catch::Matchers::Contains("without tokenizer.json"));
  fs::remove_all(dir);
}
