// data/bpe_train.h — learns a small byte-level BPE vocabulary from text, for tests and
// for `titan-tokenize --train-bpe` (a debug-model tokenizer made from local data, since no
// tokenizer files are shipped). Not meant for production-size vocabularies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// Returns the vocabulary by rank: the 256 single bytes (rank = byte value), then one token per
// learned merge, in merge order, up to `n_merges` of them (fewer when the text runs out of
// pairs). Text is pre-tokenized with the Llama-3 regex first, so merges never cross a piece
// boundary, as at encode time. Each step merges the most frequent adjacent pair (ties: the pair
// with the smaller (left id, right id)), so the result is deterministic. Because ranks follow
// merge order, BpeTokenizer's lowest-rank-first merging replays the training merges.
std::vector<std::string> train_bpe(std::string_view text, int64_t n_merges);

}  // namespace titan::data
