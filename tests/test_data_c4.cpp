// The c4 datasets over a local copy (trainer/data/c4_documents.h): JSON lines plain and
// gzip-compressed, read line by line; empty texts are documents (BOS EOS), as in torchtitan.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "trainer/data/c4_documents.h"
#include "trainer/data/token_source.h"
#include "trainer/data/tokenizer.h"

using namespace titan::trainer;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTexts = {"first document", "", "third, with \"quotes\" and \n",
                                         "f\xC3\xBCnfte"};

std::string json_lines(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string escaped;
    for (char c : texts[i]) {
      if (c == '"' || c == '\\') escaped += '\\';
      if (c == '\n') {
        escaped += "\\n";
        continue;
      }
      escaped += c;
    }
    out += "{\"text\":\"" + escaped + "\",\"timestamp\":\"2019-04-25T12:57:54Z\",\"url\":\"u" +
           std::to_string(i) + "\"}\n";
  }
  return out;
}

void write_gzip(const fs::path& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, content.data(), static_cast<unsigned>(content.size())) ==
          static_cast<int>(content.size()));
  gzclose(f);
}

}  // namespace

TEST_CASE("c4: .json.gz and plain JSON lines read the same documents", "[data][c4]") {
  const fs::path dir = titan::testing::fresh_temp_dir("c4");
  fs::create_directories(dir / "en");
  write_gzip(dir / "en" / "c4-train.00000-of-01024.json.gz", json_lines(kTexts));
  std::ofstream(dir / "plain.json") << json_lines({"plain one"});
  const std::vector<std::string> docs = read_c4_documents(dir.string());
  std::vector<std::string> want = kTexts;
  want.push_back("plain one");  // en/... sorts before plain.json
  CHECK(docs == want);
  // The compressed file is gzip indeed (magic 1f 8b), not plain text.
  std::ifstream gz(dir / "en" / "c4-train.00000-of-01024.json.gz", std::ios::binary);
  CHECK(gz.get() == 0x1f);
  CHECK(gz.get() == 0x8b);

  // Through the token source: every document framed BOS text EOS; the empty one is BOS EOS.
  const ByteTokenizer bytes;
  const auto source = make_token_source("c4", dir.string(), bytes, 0);
  int64_t want_tokens = 0;
  for (const auto& d : want) want_tokens += static_cast<int64_t>(d.size()) + 2;
  CHECK(source->size() == want_tokens);
  std::vector<int64_t> all(source->size());
  source->read(0, 0, source->size(), all.data());
  int adjacent_bos_eos = 0;
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    adjacent_bos_eos += all[i] == ByteTokenizer::kBosId && all[i + 1] == ByteTokenizer::kEosId;
  }
  CHECK(adjacent_bos_eos == 1);
  fs::remove_all(dir);
}

TEST_CASE("c4: errors name the file and line, or say what is missing", "[data][c4]") {
  const fs::path dir = titan::testing::fresh_temp_dir("c4_errors");
  write_gzip(dir / "bad.json.gz", "{\"text\":\"ok\"}\n{\"txt\":\"no text field\"}\n");
  CHECK_THROWS_WITH(read_c4_documents(dir.string()),
                    Catch::Matchers::Contains("bad.json.gz:2") &&
                        Catch::Matchers::Contains("string field \"text\""));
  fs::remove(dir / "bad.json.gz");
  std::ofstream(dir / "part-0.parquet") << "PAR1";
  CHECK_THROWS_WITH(read_c4_documents(dir.string()),
                    Catch::Matchers::Contains("titan does not implement Parquet datasets yet"));
  CHECK_THROWS_WITH(read_c4_documents(""), Catch::Matchers::Contains("titan ships no"));
  // A truncated gzip stream is an error, not a silently shorter dataset.
  write_gzip(dir / "whole.json.gz", std::string(100000, ' ') + "{\"text\":\"x\"}\n");
  std::string bytes;
  {
    std::ifstream in(dir / "whole.json.gz", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fs::remove(dir / "whole.json.gz");
  fs::remove(dir / "part-0.parquet");
  std::ofstream(dir / "cut.json.gz", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  CHECK_THROWS_WITH(read_c4_documents(dir.string()), Catch::Matchers::Contains("cut.json.gz"));
  fs::remove_all(dir);
}
