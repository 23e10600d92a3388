// data/tokenizer.h — the tokenizer interface, the byte-level tokenizer and the factory.
//
// Two tokenizers exist: byte-level (no file; ids 0..255 are bytes, BOS 256, EOS 257) for tests
// and the default debug run, and the Llama-3 BPE tokenizer read from a tiktoken file
// (bpe_tokenizer.h). Both encode any byte string and decode it back unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Special-token spellings inside `text` are encoded as plain text, never as specials: a
  // document that quotes "<|end_of_text|>" must not end the document.
  virtual std::vector<int32_t> encode(std::string_view text, bool bos, bool eos) const = 0;
  // Concatenates the bytes of each id (specials decode to their spelling). Throws on an id
  // outside [0, vocab_size).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual std::string describe() const = 0;
};

// ids 0..255 = the byte with that value, 256 = BOS, 257 = EOS; vocab_size 258.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBosId = 256;
  static constexpr int32_t kEosId = 257;
  static constexpr int64_t kVocabSize = 258;

  std::vector<int32_t> encode(std::string_view text, bool bos, bool eos) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  std::string describe() const override;
};

// "" -> ByteTokenizer; a folder with tokenizer.json or a .json file -> Hugging Face tokenizer
// (hf_tokenizer.h); otherwise a tiktoken file (Llama-3's tokenizer.model format).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& path);

}  // namespace titan::data
