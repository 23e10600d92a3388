// titan-tokenize: pre-tokenizes a text dataset into one TITANTOK shard (the `tokens` dataset),
// or, with --train-bpe N, learns a small BPE vocabulary from it and writes a tiktoken file.
//
//   titan-tokenize --tokenizer "" --format fortunes --output fortunes.bin
//   titan-tokenize --train-bpe 1790 --format fortunes --output fortunes_bpe.model
//   titan-tokenize --tokenizer fortunes_bpe.model --format jsonl --input data.jsonl --output d.bin
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "data/bpe_train.h"
#include "data/documents.h"
#include "data/tiktoken_file.h"
#include "data/token_shard.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "util/atomic_file.h"

namespace {

struct Options {
  std::string tokenizer_path;
  std::string input;
  std::string format = "fortunes";
  std::string output;
  int64_t seed = 0;
  bool keep_order = false;
  int bytes_per_token = 0;
  int64_t train_bpe_merges = -1;
};

int run(const Options& options) {
  using namespace titan::data;
  const std::vector<std::string> documents = read_documents(options.format, options.input);
  const std::string origin =
      options.format + " " + (options.input.empty() ? std::string(kFortunesDir) : options.input);

  if (options.train_bpe_merges >= 0) {
    // Documents joined by a newline: the pre-tokenizer splits there anyway.
    std::string text;
    for (const std::string& document : documents) (text += document) += '\n';
    std::vector<std::string> vocab = train_bpe(text, options.train_bpe_merges);
    write_tiktoken_file(options.output, vocab);
    std::cout << "titan-tokenize: learned " << vocab.size() - 256 << " merges from " << origin
              << " (" << documents.size() << " documents, " << text.size() << " bytes); wrote "
              << options.output << " with " << vocab.size()
              << " base tokens (vocab_size with the 256 Llama-3 specials: " << vocab.size() + 256
              << ")\n";
    return 0;
  }

  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer_path);
  // The same stream the loader builds in memory for epoch 0 with this seed (see
  // Note [Token stream]), so a `tokens` run and a text run with the same seed start alike.
  DocumentTokenSource source(documents, *tokenizer, options.seed, !options.keep_order, origin);
  std::vector<int64_t> stream(static_cast<size_t>(source.size()));
  source.read(/*epoch=*/0, 0, source.size(), stream.data());
  write_token_shard(options.output, std::vector<int32_t>(stream.begin(), stream.end()),
                    tokenizer->vocab_size(), options.bytes_per_token);
  std::cout << "titan-tokenize: " << origin << ": " << source.num_documents() << " documents ("
            << (options.keep_order ? std::string("input order")
                                   : "shuffled with seed " + std::to_string(options.seed))
            << "), " << source.size() << " tokens -> " << options.output << " ("
            << tokenizer->describe() << ")\n";
  return 0;
}

// Ctrl-C / SIGTERM while the output is being written: remove the temporary file, then die of
// the signal as before (Note [Temp files and signals] in util/atomic_file.h).
void on_termination_signal(int sig) {
  titan::util::remove_temp_files_in_flight();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"titan-tokenize: write a TITANTOK token shard (dataset 'tokens') from a text "
               "dataset, or learn a BPE vocabulary (--train-bpe)"};
  app.add_option("--tokenizer", options.tokenizer_path,
                 "tiktoken file (Llama-3 tokenizer.model format); \"\" = byte-level");
  app.add_option("--input", options.input,
                 "dataset file or folder (fortunes: default /usr/share/games/fortunes)");
  app.add_option("--format", options.format, "input format")
      ->check(CLI::IsMember({"fortunes", "text", "jsonl", "c4"}))
      ->capture_default_str();
  app.add_option("--output", options.output,
                 "output path: a .bin shard, or with --train-bpe a tiktoken file")
      ->required();
  app.add_option("--seed", options.seed,
                 "document shuffle seed (the loader's epoch-0 order for the same seed)")
      ->capture_default_str();
  app.add_flag("--keep-order", options.keep_order, "keep the input's document order");
  app.add_option("--bytes-per-token", options.bytes_per_token,
                 "id width in the shard: 2, 4, or 0 = 2 when the vocabulary fits uint16")
      ->check(CLI::IsMember({0, 2, 4}))
      ->capture_default_str();
  app.add_option("--train-bpe", options.train_bpe_merges,
                 "learn this many BPE merges from the input and write a tiktoken file to "
                 "--output instead of a shard");
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGINT, on_termination_signal);
  std::signal(SIGTERM, on_termination_signal);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "titan-tokenize: error: " << e.what() << "\n";
    return 1;
  }
}
