// Tests for data/: tokenizers (byte-level, Llama-3 BPE), datasets, token shards and the
// packing data loader (DP invariance, resume).
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <climits>
#include <filesystem>
#include <fstream>
#include <random>
#include <unordered_map>

#include "data/bpe_tokenizer.h"
#include "data/bpe_train.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/pretokenizer.h"
#include "data/tiktoken_file.h"
#include "data/token_shard.h"
#include "data/token_source.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace titan::data;

namespace {

// A fresh folder under the system temp dir, removed with everything in it at scope end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("titan_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

std::vector<int64_t> to_vec(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

const char* const kNonAscii = "Gr\xC3\xBC\xC3\x9F" "e, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82";

const char* const kTrainingText =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.\n"
    "In the beginning there was the word, and the word was tokenized into bytes.\n"
    "Byte pair encoding merges the most frequent pair of symbols again and again, "
    "until the vocabulary is as large as the training run wants it to be.\n\n"
    "Numbers such as 12345, 2024 and 3.14159 are split into groups of three digits.\n"
    "Gr\xC3\xBC\xC3\x9F" "e aus M\xC3\xBCnchen! Caf\xC3\xA9 cr\xC3\xA8me br\xC3\xBBl\xC3\xA9" "e. "
    "\xE4\xB8\x96\xE7\x95\x8C\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82\xF0\x9F\x99\x82\n"
    "It's what they're saying: we'll see, you'd know, I'm sure, they've gone.\n"
    "    indented code() { return x + y; }   // comment\n";

// tiktoken's reference _byte_pair_merge (quadratic; leftmost lowest rank first).
std::vector<int32_t> reference_bpe(const std::unordered_map<std::string, int32_t>& ranks,
                                   const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  constexpr int32_t kMax = INT32_MAX;
  auto lookup = [&](size_t begin, size_t end) {
    auto it = ranks.find(piece.substr(begin, end - begin));
    return it == ranks.end() ? kMax : it->second;
  };
  std::vector<std::pair<size_t, int32_t>> parts;
  for (size_t i = 0; i + 1 < piece.size(); ++i) parts.emplace_back(i, lookup(i, i + 2));
  parts.emplace_back(piece.size() - 1, kMax);
  parts.emplace_back(piece.size(), kMax);
  auto get_rank = [&](size_t i) {
    return i + 3 < parts.size() ? lookup(parts[i].first, parts[i + 3].first) : kMax;
  };
  while (true) {
    int32_t min_rank = kMax;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].second < min_rank) {
        min_rank = parts[i].second;
        min_i = i;
      }
    }
    if (min_rank == kMax) break;
    if (min_i > 0) parts[min_i - 1].second = get_rank(min_i - 1);
    parts[min_i].second = get_rank(min_i);
    parts.erase(parts.begin() + static_cast<long>(min_i) + 1);
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    ids.push_back(ranks.at(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first)));
  }
  return ids;
}

// A corpus of `n` small text documents of varying length in `dir`.
void write_text_corpus(const TempDir& dir, int n) {
  for (int i = 0; i < n; ++i) {
    std::string doc = "document " + std::to_string(i) + ":";
    for (int k = 0; k < 3 + (i * 7) % 11; ++k) doc += " word" + std::to_string(k);
    write_file(dir.file("doc" + std::to_string(100 + i) + ".txt"), doc);
  }
}

DataConfig text_config(const TempDir& dir, int64_t seq_len, int64_t global_batch) {
  DataConfig config;
  config.dataset = "text";
  config.dataset_path = dir.path.string();
  config.seq_len = seq_len;
  config.global_batch_size = global_batch;
  config.seed = 7;
  return config;
}

}  // namespace

TEST_CASE("byte tokenizer round-trips any bytes", "[data][tokenizer]") {
  auto tok = make_tokenizer("");
  CHECK(tok->vocab_size() == 258);
  CHECK(tok->bos_id() == 256);
  CHECK(tok->eos_id() == 257);
  for (std::string text : {std::string("hello, world"), std::string(kNonAscii), std::string()}) {
    CHECK(tok->decode(tok->encode(text, false, false)) == text);
  }
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  CHECK(tok->decode(tok->encode(all_bytes, false, false)) == all_bytes);

  auto ids = tok->encode("\xC3\xBC", true, true);  // "ü"
  CHECK(ids == std::vector<int32_t>{256, 0xC3, 0xBC, 257});
  CHECK(tok->decode(ids) == "<|begin_of_text|>\xC3\xBC<|end_of_text|>");
  CHECK_THROWS_WITH(tok->decode({258}), Catch::Contains("258"));
}

TEST_CASE("Llama-3 pre-tokenizer splits like the reference regex", "[data][tokenizer]") {
  using Pieces = std::vector<std::string_view>;
  CHECK(std::string(kLlama3SplitPattern) ==
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+)"
        R"([\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  CHECK(pretokenize_llama3("Hello world's 12345") ==
        Pieces{"Hello", " world", "'s", " ", "123", "45"});
  CHECK(pretokenize_llama3("I'M fine") == Pieces{"I", "'M", " fine"});
  CHECK(pretokenize_llama3("a  b") == Pieces{"a", " ", " b"});
  CHECK(pretokenize_llama3("Hello\n\nworld!!\n") == Pieces{"Hello", "\n\n", "world", "!!\n"});
  // Unicode letters stay in one piece (UCP mode), emoji are "other" symbols.
  CHECK(pretokenize_llama3(kNonAscii) ==
        Pieces{"Gr\xC3\xBC\xC3\x9F" "e", ",", " \xE4\xB8\x96\xE7\x95\x8C", " \xF0\x9F\x99\x82"});
  // Invalid UTF-8 becomes its own piece; nothing is lost.
  std::string bad = "ab\xFF\xFE cd\x80";
  std::string joined;
  for (auto piece : pretokenize_llama3(bad)) joined += piece;
  CHECK(joined == bad);
}

TEST_CASE("BPE: hand-made vocabulary gives the expected merges and special ids", "[data][bpe]") {
  TempDir dir;
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  for (const char* merged : {"ll", "he", "hell", "hello", " w", "or"}) vocab.emplace_back(merged);
  const std::string path = dir.file("hand.model");
  write_tiktoken_file(path, vocab);
  auto tok = make_tokenizer(path);
  auto* bpe = dynamic_cast<BpeTokenizer*>(tok.get());
  REQUIRE(bpe != nullptr);

  // "hello": ll(256) first, then he(257), hell(258), hello(259); " world": " w"(260), "or"(261).
  CHECK(tok->encode("hello world", false, false) == std::vector<int32_t>{259, 260, 261, 108, 100});
  CHECK(bpe->num_base_tokens() == 262);
  CHECK(tok->vocab_size() == 262 + 256);
  CHECK(tok->bos_id() == 262);  // <|begin_of_text|> = num_base
  CHECK(tok->eos_id() == 263);  // <|end_of_text|> = num_base + 1
  CHECK(bpe->special_token_id("<|begin_of_text|>") == 262);
  CHECK(bpe->special_token_id("<|finetune_right_pad_id|>") == 262 + 4);
  CHECK(bpe->special_token_id("<|eot_id|>") == 262 + 9);
  CHECK(bpe->special_token_id("<|python_tag|>") == 262 + 10);
  CHECK(bpe->special_token_id("<|reserved_special_token_2|>") == 262 + 11);
  CHECK(bpe->special_token_id("<|reserved_special_token_246|>") == 262 + 255);
  CHECK_THROWS(bpe->special_token_id("<|reserved_special_token_247|>"));
  CHECK(tok->decode({262, 259, 263}) == "<|begin_of_text|>hello<|end_of_text|>");

  // Special spellings in text are plain text, not specials.
  auto ids = tok->encode("<|end_of_text|>", false, false);
  for (int32_t id : ids) CHECK(id < 262);
  CHECK(tok->decode(ids) == "<|end_of_text|>");
  auto framed = tok->encode("hello", true, true);
  CHECK(framed == std::vector<int32_t>{262, 259, 263});
}

TEST_CASE("BPE: train_bpe learns the most frequent pairs in order", "[data][bpe]") {
  // Pairs: (a,b) x4 -> "ab"; then (" ", ab) x3 -> " ab"; then the tie (" ",c)/(c,d) goes to
  // the smaller ids -> " c"; then " cd".
  std::vector<std::string> vocab = train_bpe("ab ab ab ab cd", 10);
  REQUIRE(vocab.size() == 260);
  CHECK(vocab[256] == "ab");
  CHECK(vocab[257] == " ab");
  CHECK(vocab[258] == " c");
  CHECK(vocab[259] == " cd");
  for (int b = 0; b < 256; ++b) CHECK(vocab[b] == std::string(1, static_cast<char>(b)));
  CHECK(train_bpe("ab ab ab ab cd", 1).size() == 257);

  TempDir dir;
  write_tiktoken_file(dir.file("small.model"), vocab);
  auto tok = make_tokenizer(dir.file("small.model"));
  CHECK(tok->encode("ab ab cd", false, false) == std::vector<int32_t>{256, 257, 259});
}

TEST_CASE("BPE: trained vocabulary round-trips and matches tiktoken's merge", "[data][bpe]") {
  TempDir dir;
  std::vector<std::string> vocab = train_bpe(kTrainingText, 300);
  REQUIRE(vocab.size() > 300);
  const std::string path = dir.file("trained.model");
  write_tiktoken_file(path, vocab);
  REQUIRE(read_tiktoken_file(path) == vocab);
  auto tok = make_tokenizer(path);
  CHECK(tok->vocab_size() == static_cast<int64_t>(vocab.size()) + 256);

  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  for (std::string text : {std::string(kTrainingText), std::string(kNonAscii),
                           std::string("Hello world's 12345"), all_bytes, std::string()}) {
    CHECK(tok->decode(tok->encode(text, false, false)) == text);
  }
  // Learned merges compress the training text.
  CHECK(tok->encode(kTrainingText, false, false).size() * 2 < std::string(kTrainingText).size());

  // The O(n log n) merge agrees with tiktoken's quadratic reference on random text.
  std::unordered_map<std::string, int32_t> ranks;
  for (size_t r = 0; r < vocab.size(); ++r) ranks.emplace(vocab[r], static_cast<int32_t>(r));
  const std::string source = std::string(kTrainingText) + "\xFF\xFE\x80";
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int length = 1 + static_cast<int>(rng() % 120);
    for (int i = 0; i < length; ++i) text += source[rng() % source.size()];
    std::vector<int32_t> expected;
    for (auto piece : pretokenize_llama3(text)) {
      auto ids = reference_bpe(ranks, std::string(piece));
      expected.insert(expected.end(), ids.begin(), ids.end());
    }
    REQUIRE(tok->encode(text, false, false) == expected);
  }
  // Long single pieces (exercise the heap path) agree as well.
  std::string letters;
  for (int i = 0; i < 2000; ++i) letters += "thequickbrownfox"[rng() % 16];
  CHECK(tok->encode(letters, false, false) == reference_bpe(ranks, letters));
}

TEST_CASE("tiktoken file errors name the file and line", "[data][bpe]") {
  TempDir dir;
  const std::string path = dir.file("bad.model");
  auto expect_error = [&](const std::string& content, const std::string& fragment) {
    write_file(path, content);
    CHECK_THROWS_WITH(make_tokenizer(path),
                      Catch::Contains(path) && Catch::Contains(fragment));
  };
  expect_error("YQ== 0\nYg== 1\n!!notbase64 2\n", "line 3");
  expect_error("YQ== 0\nYg==1\n", "line 2");
  expect_error("YQ== 0\nYg== x\n", "line 2");
  expect_error("YQ== 0\n\nYg== 0\n", "line 3");           // duplicate rank
  expect_error("YQ== 0\nYQ== 1\n", "line 2");             // duplicate token
  expect_error("YQ== 0\nYg== 5\n", "line 2");             // gap in ranks
  expect_error("", "no tokens");
  expect_error("YQ== 0\nYg== 1\n", "single-byte token");  // valid file, but not byte-level
  CHECK_THROWS_WITH(make_tokenizer(dir.file("missing.model")), Catch::Contains("missing.model"));
}

TEST_CASE("loader packs windows: labels are inputs shifted by one, BOS/EOS frame documents",
          "[data][loader]") {
  TempDir dir;
  write_text_corpus(dir, 12);
  ByteTokenizer tok;
  DataConfig config = text_config(dir, /*seq_len=*/16, /*global_batch=*/3);
  DataLoader loader(config, tok);

  // Expected stream of epoch e: documents (sorted file order) in shuffled_order(n, seed + e).
  std::vector<std::string> docs = read_text_documents(dir.path.string());
  auto stream_of_epoch = [&](int64_t epoch) {
    std::vector<int64_t> stream;
    for (int64_t d : shuffled_order(static_cast<int64_t>(docs.size()), config.seed + epoch)) {
      auto ids = tok.encode(docs[d], true, true);
      stream.insert(stream.end(), ids.begin(), ids.end());
    }
    return stream;
  };
  const std::vector<int64_t> epoch0 = stream_of_epoch(0);
  const std::vector<int64_t> epoch1 = stream_of_epoch(1);
  REQUIRE(loader.tokens_in_stream() == static_cast<int64_t>(epoch0.size()));
  const int64_t window = 17;
  const int64_t windows = loader.windows_per_epoch();
  REQUIRE(windows == static_cast<int64_t>(epoch0.size()) / window);
  CHECK(epoch0.front() == 256);
  CHECK(epoch0.back() == 257);

  // Run through more than one epoch and compare every row with the expected window.
  const int64_t steps = windows / 3 + 4;
  for (int64_t step = 0; step < steps; ++step) {
    Batch batch = loader.next_batch();
    REQUIRE(batch.inputs.sizes() == at::IntArrayRef({3, 16}));
    REQUIRE(batch.labels.sizes() == at::IntArrayRef({3, 16}));
    REQUIRE(batch.inputs.scalar_type() == at::kLong);
    auto inputs = to_vec(batch.inputs);
    auto labels = to_vec(batch.labels);
    for (int64_t row = 0; row < 3; ++row) {
      const int64_t w = step * 3 + row;
      const auto& stream = w < windows ? epoch0 : epoch1;
      const int64_t start = (w % windows) * window;
      for (int64_t t = 0; t < 16; ++t) {
        REQUIRE(inputs[row * 16 + t] == stream[start + t]);
        REQUIRE(labels[row * 16 + t] == stream[start + t + 1]);
      }
    }
  }
  // The first window starts a document; every EOS in it is followed by a BOS.
  DataLoader fresh(config, tok);
  auto first = to_vec(fresh.next_batch().inputs);
  CHECK(first[0] == 256);
  for (size_t i = 0; i + 1 < 16; ++i) {
    if (first[i] == 257) CHECK(first[i + 1] == 256);
  }
  CHECK(loader.describe().find("windows") != std::string::npos);
}

TEST_CASE("loader: global batches do not depend on the data-parallel degree", "[data][loader]") {
  TempDir dir;
  write_text_corpus(dir, 20);
  ByteTokenizer tok;
  DataConfig base = text_config(dir, 12, 8);
  for (int degree : {2, 4, 8}) {
    DataLoader reference(base, tok);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < degree; ++r) {
      DataConfig config = base;
      config.dp_rank = r;
      config.dp_degree = degree;
      ranks.push_back(std::make_unique<DataLoader>(config, tok));
    }
    for (int step = 0; step < 30; ++step) {  // crosses epoch boundaries
      Batch full = reference.next_batch();
      std::vector<at::Tensor> inputs, labels;
      for (auto& rank : ranks) {
        Batch part = rank->next_batch();
        REQUIRE(part.inputs.size(0) == 8 / degree);
        inputs.push_back(part.inputs);
        labels.push_back(part.labels);
      }
      REQUIRE(at::cat(inputs, 0).equal(full.inputs));
      REQUIRE(at::cat(labels, 0).equal(full.labels));
      // Splitting a rank's rows into micro-batches keeps the same tokens in the same order.
      if (degree == 2) {
        at::Tensor rows = inputs[1];
        std::vector<at::Tensor> micro = {rows.narrow(0, 0, 2), rows.narrow(0, 2, 2)};
        REQUIRE(at::cat(micro, 0).equal(full.inputs.narrow(0, 4, 4)));
      }
    }
  }
  DataConfig bad = base;
  bad.dp_degree = 3;
  CHECK_THROWS_WITH(DataLoader(bad, tok),
                    Catch::Contains("not divisible") && Catch::Contains("(8)"));
}

TEST_CASE("loader state: save, load and continue identically, also under another DP layout",
          "[data][loader]") {
  TempDir dir;
  write_text_corpus(dir, 10);
  ByteTokenizer tok;
  DataConfig config = text_config(dir, 10, 4);
  DataLoader loader(config, tok);
  for (int i = 0; i < 5; ++i) loader.next_batch();
  const std::string state = loader.state_dict();
  std::vector<Batch> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(loader.next_batch());

  DataLoader resumed(config, tok);
  resumed.load_state_dict(state);
  CHECK(resumed.batches_consumed() == 5);
  for (int i = 0; i < 8; ++i) {
    Batch batch = resumed.next_batch();
    REQUIRE(batch.inputs.equal(expected[i].inputs));
    REQUIRE(batch.labels.equal(expected[i].labels));
  }
  // Rank 1 of 2 resumes from the same state into its half of the rows.
  DataConfig half = config;
  half.dp_rank = 1;
  half.dp_degree = 2;
  DataLoader rank1(half, tok);
  rank1.load_state_dict(state);
  CHECK(rank1.next_batch().inputs.equal(expected[0].inputs.narrow(0, 2, 2)));

  DataConfig other = config;
  other.seq_len = 11;
  DataLoader mismatched(other, tok);
  CHECK_THROWS_WITH(mismatched.load_state_dict(state), Catch::Contains("seq_len"));
  other = config;
  other.global_batch_size = 8;
  DataLoader mismatched_batch(other, tok);
  CHECK_THROWS_WITH(mismatched_batch.load_state_dict(state),
                    Catch::Contains("global_batch_size"));
  CHECK_THROWS(resumed.load_state_dict("{not json"));
}

TEST_CASE("loader errors: short corpus, unknown dataset", "[data][loader]") {
  TempDir dir;
  write_file(dir.file("tiny.txt"), "tiny");
  ByteTokenizer tok;
  DataConfig config = text_config(dir, 64, 1);
  // "tiny" + BOS + EOS = 6 tokens < 65.
  CHECK_THROWS_WITH(DataLoader(config, tok), Catch::Contains(dir.path.string()) &&
                                                 Catch::Contains("6 tokens") &&
                                                 Catch::Contains("65"));
  config.dataset = "c4_mini";  // torchtitan has it; titan refuses it by name
  CHECK_THROWS_WITH(DataLoader(config, tok), Catch::Contains("allowed"));
  config.dataset = "text";
  config.dataset_path = dir.file("nope");
  CHECK_THROWS_WITH(DataLoader(config, tok), Catch::Contains("nope"));
}

TEST_CASE("jsonl dataset: documents from \"text\", bad lines name file and line", "[data]") {
  TempDir dir;
  const std::string good = dir.file("good.jsonl");
  write_file(good, "{\"text\": \"first doc\", \"id\": 1}\n\n{\"text\": \"second \\u00fc\"}\n");
  auto docs = read_jsonl_documents(good);
  REQUIRE(docs.size() == 2);
  CHECK(docs[0] == "first doc");
  CHECK(docs[1] == "second \xC3\xBC");
  // An empty "text" is a document (torchtitan's dataset yields BOS EOS for it), blank lines are not.
  const std::string with_empty = dir.file("empty.jsonl");
  write_file(with_empty, "{\"text\": \"a\"}\n{\"text\": \"\"}\n\n{\"text\": \"b\"}\n");
  docs = read_jsonl_documents(with_empty);
  REQUIRE(docs.size() == 3);
  CHECK(docs[1].empty());

  const std::string bad = dir.file("bad.jsonl");
  write_file(bad, "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": broken}\n");
  CHECK_THROWS_WITH(read_jsonl_documents(bad), Catch::Contains("bad.jsonl:3"));
  write_file(bad, "{\"text\": \"ok\"}\n{\"body\": \"no text field\"}\n");
  CHECK_THROWS_WITH(read_jsonl_documents(bad),
                    Catch::Contains("bad.jsonl:2") && Catch::Contains("\"text\""));
}

TEST_CASE("token shards: write, mmap read, validation, and the tokens dataset", "[data][shard]") {
  TempDir dir;
  for (int width : {2, 4}) {
    std::vector<int32_t> ids = {256, 1, 2, 3, 257, 256, 255, 0, 257};
    const std::string path = dir.file("w" + std::to_string(width) + ".bin");
    write_token_shard(path, ids, 258, width);
    CHECK_FALSE(fs::exists(path + ".tmp"));
    TokenShard shard(path);
    CHECK(shard.size() == 9);
    CHECK(shard.vocab_size() == 258);
    CHECK(shard.bytes_per_token() == width);
    CHECK(fs::file_size(path) == 32 + 9 * static_cast<uintmax_t>(width));
    std::vector<int64_t> back(9);
    shard.read(0, 9, back.data());
    CHECK(back == std::vector<int64_t>(ids.begin(), ids.end()));
  }
  CHECK_THROWS(write_token_shard(dir.file("x.bin"), {300}, 258));
  CHECK_THROWS(write_token_shard(dir.file("x.bin"), {1}, 100000, 2));

  // Corrupt files: each error names the file.
  write_file(dir.file("magic.bin"), std::string(40, 'x'));
  CHECK_THROWS_WITH(TokenShard(dir.file("magic.bin")),
                    Catch::Contains("magic.bin") && Catch::Contains("magic"));
  write_file(dir.file("short.bin"), "TITANTOK");
  CHECK_THROWS_WITH(TokenShard(dir.file("short.bin")), Catch::Contains("short.bin"));
  {
    std::ifstream in(dir.file("w2.bin"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_file(dir.file("truncated.bin"), bytes.substr(0, bytes.size() - 2));
  }
  CHECK_THROWS_WITH(TokenShard(dir.file("truncated.bin")),
                    Catch::Contains("truncated.bin") && Catch::Contains("truncated"));

  // A shard written like titan-tokenize (epoch-0 order, same seed) replays the text loader's
  // first epoch exactly; split over two shards it reads across the boundary.
  TempDir corpus;
  write_text_corpus(corpus, 15);
  ByteTokenizer tok;
  DataConfig text = text_config(corpus, 9, 2);
  DocumentTokenSource source(read_text_documents(corpus.path.string()), tok, text.seed,
                             /*shuffle=*/true, "test corpus");
  std::vector<int64_t> stream(static_cast<size_t>(source.size()));
  source.read(0, 0, source.size(), stream.data());
  const size_t half = stream.size() / 2 + 3;
  TempDir shards;
  write_token_shard(shards.file("part-000.bin"),
                    std::vector<int32_t>(stream.begin(), stream.begin() + half), 258);
  write_token_shard(shards.file("part-001.bin"),
                    std::vector<int32_t>(stream.begin() + half, stream.end()), 258);
  DataConfig tokens = text;
  tokens.dataset = "tokens";
  tokens.dataset_path = shards.path.string();
  DataLoader from_text(text, tok);
  DataLoader from_shards(tokens, tok);
  REQUIRE(from_shards.tokens_in_stream() == from_text.tokens_in_stream());
  for (int64_t i = 0; i < from_text.windows_per_epoch() / 2; ++i) {
    Batch a = from_text.next_batch();
    Batch b = from_shards.next_batch();
    REQUIRE(a.inputs.equal(b.inputs));
    REQUIRE(a.labels.equal(b.labels));
  }
  // A shard made for another vocabulary is refused.
  TempDir other;
  write_token_shard(other.file("v.bin"), {1, 2, 3}, 1000);
  tokens.dataset_path = other.file("v.bin");
  CHECK_THROWS_WITH(DataLoader(tokens, tok), Catch::Contains("v.bin") && Catch::Contains("1000"));
}

TEST_CASE("fortunes dataset loads with the byte tokenizer", "[data][fortunes]") {
  if (!fs::is_directory(kFortunesDir)) {
    FAIL(std::string(kFortunesDir) +
         " is missing: run scripts/setup.sh (installs the Debian package 'fortunes')");
  }
  auto docs = read_fortunes("");
  CHECK(docs.size() > 1000);
  // A path that exists but is a file: said so, not "not found".
  const fs::path file = fs::temp_directory_path() / ("titan_fortunes_file_" + std::to_string(getpid()));
  { std::ofstream(file) << "one\n%\n"; }
  CHECK_THROWS_WITH(read_fortunes(file.string()),
                    Catch::Contains("training.dataset_path " + file.string() + " is a regular file") &&
                        Catch::Contains("reads a folder of fortune files"));
  fs::remove(file);
  CHECK_THROWS_WITH(read_fortunes("/nonexistent/fortunes"), Catch::Contains("not found"));
  for (const std::string& doc : docs) REQUIRE(doc.find("\n%\n") == std::string::npos);
  ByteTokenizer tok;
  DataConfig config;
  config.dataset = "fortunes";
  config.seq_len = 256;
  config.global_batch_size = 8;
  config.seed = 0;
  DataLoader loader(config, tok);
  INFO(loader.describe());
  CHECK(loader.tokens_in_stream() > 100000);
  Batch batch = loader.next_batch();
  CHECK(batch.inputs.sizes() == at::IntArrayRef({8, 256}));
}
