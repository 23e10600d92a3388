// data/tiktoken_file.h — the tiktoken vocabulary file (Llama-3's tokenizer.model):
// one line per token, "<base64 of the token's bytes> <rank>", ranks 0..n-1 each exactly once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// Returns the token bytes indexed by rank. Empty lines are ignored (as tiktoken does). Throws
// std::runtime_error naming the file and the 1-based line for: a line that is not
// "<base64> <rank>", bad base64, an empty token, a non-numeric rank, a duplicate token or rank,
// or ranks that do not cover 0..n-1.
std::vector<std::string> read_tiktoken_file(const std::string& path);

// Writes `tokens` (index = rank) in the same format, whole or not at all (util/atomic_file.h), so a reader
// never sees half a file.
void write_tiktoken_file(const std::string& path, const std::vector<std::string>& tokens);

std::string base64_encode(std::string_view bytes);
// False on anything but canonical padded base64 (standard alphabet).
bool base64_decode(std::string_view text, std::string* bytes);

}  // namespace titan::data
