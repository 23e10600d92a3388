// data/hf_tokenizer.h — Hugging Face tokenizer assets (torchtitan's model.hf_assets_path):
// tokenizer.json (+ tokenizer_config.json) read as a byte-level BPE tokenizer.
//
// From tokenizer.json: model.vocab (byte-level strings: GPT-2's byte-to-unicode map, e.g. 'Ġ' is
// the space byte) -> token bytes by id; model.merges ("a b" or ["a", "b"]) -> merge priorities;
// model.ignore_merges; added_tokens with ids after the vocabulary -> the special tokens;
// pre_tokenizer: a Split on a regex (behavior Isolated) followed by ByteLevel without its own
// regex, or ByteLevel with GPT-2's regex. From tokenizer_config.json: bos_token and eos_token
// (strings or {"content": ...}); without that file <|begin_of_text|> / <|end_of_text|>.
// Llama 3's tokenizer.json gives the same ids as its tiktoken file (tests/test_data_hf.cpp).
// Anything else (a normalizer, add_prefix_space, another model type) is refused by name.
#pragma once

#include <memory>
#include <string>

#include "data/bpe_tokenizer.h"

namespace titan::data {

// `path`: a folder holding tokenizer.json, or the tokenizer.json file itself.
std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path);

// GPT-2's byte-level alphabet: the string tokenizer.json spells `bytes` with, and back.
std::string bytes_to_byte_level(std::string_view bytes);
// False if `text` holds a character outside the 256 of the alphabet.
bool byte_level_to_bytes(std::string_view text, std::string* bytes);

}  // namespace titan::data
