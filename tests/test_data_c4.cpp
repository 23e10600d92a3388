// The c4 datasets over a local copy (data/c4_documents.h): JSON lines plain and
// gzip-compressed, read line by line, and Parquet files written by the pyarrow wheel, one row
// group at a time; empty texts are documents (BOS EOS), as in torchtitan. The stream over them
// (data/streaming_source.h) against the same documents held in memory.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/c4_documents.h"
#include "data/streaming_source.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "temp_dir.h"

using namespace titan::data;
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

  // Through the token source: every document framed BOS text EOS; the empty one is BOS EOS;
  // after the last document the first one again (the next pass).
  const ByteTokenizer bytes;
  const auto source = make_token_source("c4", dir.string(), bytes, 0);
  CHECK(source->endless());
  int64_t pass_tokens = 0;
  for (const auto& d : want) pass_tokens += static_cast<int64_t>(d.size()) + 2;
  std::vector<int64_t> all(static_cast<size_t>(2 * pass_tokens));
  source->read(0, 0, 2 * pass_tokens, all.data());
  int adjacent_bos_eos = 0;
  for (int64_t i = 0; i + 1 < pass_tokens; ++i) {
    adjacent_bos_eos += all[i] == ByteTokenizer::kBosId && all[i + 1] == ByteTokenizer::kEosId;
  }
  CHECK(adjacent_bos_eos == 1);
  CHECK(std::equal(all.begin(), all.begin() + pass_tokens, all.begin() + pass_tokens));
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
                    Catch::Matchers::Contains("part-0.parquet") &&
                        Catch::Matchers::Contains(parquet_supported() ? "not a readable Parquet file"
                                                                      : "no Parquet reader"));
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

namespace {

// Writes Parquet files with the pyarrow wheel's own writer (scripts/setup.sh pins it): the
// reader is checked against files exactly as Hugging Face datasets publish them.
void write_parquet_fixtures(const fs::path& dir) {
  const fs::path script = dir / "write.py";
  std::ofstream(script) << R"(import sys, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
texts = ["first", "", "third \u00fcml", "fourth " * 50, "fifth"]
# Row groups of 2 rows: the reader crosses row-group (and chunk) boundaries.
pq.write_table(pa.table({"id": list(range(5)), "text": texts}), d + "/data/a.parquet", row_group_size=2)
pq.write_table(pa.table({"text": pa.array(["large one", "large two"], pa.large_string())}),
               d + "/data/b.parquet", compression="zstd")
pq.write_table(pa.table({"content": ["no text column"], "url": ["u"]}), d + "/bad/nocol.parquet")
pq.write_table(pa.table({"text": ["ok", None]}), d + "/bad/null.parquet")
pq.write_table(pa.table({"text": [1, 2]}), d + "/bad/ints.parquet")
)";
  fs::create_directories(dir / "data");
  fs::create_directories(dir / "bad");
  const std::string cmd = std::string(TITAN_PYTHON) + " " + script.string() + " " + dir.string();
  REQUIRE(std::system(cmd.c_str()) == 0);
}

}  // namespace

TEST_CASE("c4: Parquet files written by pyarrow stream their \"text\" column", "[data][c4]") {
  const fs::path dir = titan::testing::fresh_temp_dir("c4_parquet");
  write_parquet_fixtures(dir);
  if (!parquet_supported()) {  // a TITAN_PARQUET=OFF build says so, naming the file
    CHECK_THROWS_WITH(read_c4_documents((dir / "data").string()),
                      Catch::Matchers::Contains("a.parquet") &&
                          Catch::Matchers::Contains("no Parquet reader"));
    fs::remove_all(dir);
    return;
  }
  const std::vector<std::string> want = {"first", "", "third \xC3\xBCml", [] {
                                           std::string s;
                                           for (int i = 0; i < 50; ++i) s += "fourth ";
                                           return s;
                                         }(),
                                         "fifth", "large one", "large two"};
  CHECK(read_c4_documents((dir / "data").string()) == want);
  CHECK_THROWS_WITH(read_c4_documents((dir / "bad" / "nocol.parquet").string()),
                    Catch::Matchers::Contains("nocol.parquet") &&
                        Catch::Matchers::Contains("no column \"text\" (its columns: content, url)"));
  CHECK_THROWS_WITH(read_c4_documents((dir / "bad" / "null.parquet").string()),
                    Catch::Matchers::Contains("null.parquet") &&
                        Catch::Matchers::Contains("row 1 has a null \"text\""));
  CHECK_THROWS_WITH(read_c4_documents((dir / "bad" / "ints.parquet").string()),
                    Catch::Matchers::Contains("column \"text\" holds int64"));
  // A cut file (the footer lost) is an error, not a shorter dataset.
  {
    std::ifstream in(dir / "data" / "a.parquet", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir / "bad" / "cut.parquet", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  CHECK_THROWS_WITH(read_c4_documents((dir / "bad" / "cut.parquet").string()),
                    Catch::Matchers::Contains("cut.parquet") &&
                        Catch::Matchers::Contains("not a readable Parquet file"));
  fs::remove_all(dir);
}

TEST_CASE("c4: the stream equals the documents in memory, holds little, and resumes from hints",
          "[data][c4]") {
  const fs::path dir = titan::testing::fresh_temp_dir("c4_stream");
  // Ten files of 40 documents of varied length (some empty).
  std::vector<std::string> documents;
  for (int f = 0; f < 10; ++f) {
    std::vector<std::string> texts;
    for (int d = 0; d < 40; ++d) {
      texts.push_back(std::string(static_cast<size_t>((f * 7 + d * 13) % 97), static_cast<char>('a' + (f + d) % 26)));
    }
    write_gzip(dir / ("c4-train.0000" + std::to_string(f) + "-of-00010.json.gz"), json_lines(texts));
    documents.insert(documents.end(), texts.begin(), texts.end());
  }
  const ByteTokenizer bytes;
  std::vector<int64_t> pass;  // one pass of the stream, built independently
  for (const std::string& d : documents) {
    pass.push_back(ByteTokenizer::kBosId);
    for (unsigned char c : d) pass.push_back(c);
    pass.push_back(ByteTokenizer::kEosId);
  }
  const auto n = static_cast<int64_t>(pass.size());
  auto expected = [&](int64_t offset) { return pass[static_cast<size_t>(offset % n)]; };

  StreamingTokenSource source(c4_files(dir.string()), bytes, "c4 test");
  // Windows as two data-parallel ranks read them: rank 1's rows of each global batch, skipping
  // rank 0's; across file boundaries and into the third pass.
  const int64_t window = 33;
  std::vector<int64_t> got(static_cast<size_t>(window));
  int64_t most_buffered = 0;
  for (int64_t w = 1; w * window < 2 * n + 500; w += 2) {
    source.read(0, w * window, window, got.data());
    for (int64_t i = 0; i < window; ++i) REQUIRE(got[static_cast<size_t>(i)] == expected(w * window + i));
    most_buffered = std::max(most_buffered, source.buffered_tokens());
  }
  // What is held after a read: the tokens from the window on (a window plus the rest of the
  // last document pulled, <= 96 bytes + BOS EOS), plus a prefix already read that is dropped
  // once it is half the buffer: at most twice that.
  CHECK(most_buffered <= 2 * (window + 98));

  // Going back rewinds to a file start; a fresh source given the hints jumps ahead.
  source.read(0, 5, window, got.data());
  for (int64_t i = 0; i < window; ++i) CHECK(got[static_cast<size_t>(i)] == expected(5 + i));
  const std::string hints = source.resume_hints();
  StreamingTokenSource resumed(c4_files(dir.string()), bytes, "c4 test");
  resumed.load_resume_hints(hints);
  const int64_t far = 2 * n + 17;
  resumed.read(0, far, window, got.data());
  for (int64_t i = 0; i < window; ++i) CHECK(got[static_cast<size_t>(i)] == expected(far + i));
  // It started at the file holding `far`, not at the beginning: it holds one file at most.
  CHECK(resumed.buffered_tokens() <= n / 10 + 200);

  // A different corpus (a file grew) or tokenizer: the hints are refused, naming what changed.
  write_gzip(dir / "c4-train.00009-of-00010.json.gz", json_lines({"a new document"}));
  StreamingTokenSource changed(c4_files(dir.string()), bytes, "c4 test");
  CHECK_THROWS_WITH(changed.load_resume_hints(hints),
                    Catch::Matchers::Contains("different corpus") &&
                        Catch::Matchers::Contains("c4-train.00009-of-00010.json.gz"));
  fs::remove_all(dir);
}
