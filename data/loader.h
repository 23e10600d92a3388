// data/loader.h — packs a dataset's token stream into training batches (torchtitan's
// packing): each epoch's stream (see Note [Token stream]) is cut into consecutive,
// non-overlapping windows of seq_len + 1 tokens; a row's inputs are window[:-1] and its labels
// window[1:]. The tail of an epoch shorter than a window is dropped (< 1 window per epoch).
//
// Note [Global batch order]: window w of the whole run (all epochs back to back) is window
// w % W of epoch w / W (W = windows per epoch), and global batch b is windows
// [b * G, (b + 1) * G) (G = global_batch_size) — so the batch sequence depends only on the
// data, seed, seq_len and G, never on the data-parallel layout. Rank r of D reads rows
// [r * G/D, (r + 1) * G/D) of each global batch; the trainer may split those rows further into
// micro-batches. The reader position is just b, so a checkpoint taken with one DP degree resumes
// exactly under another.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "data/token_source.h"
#include "data/tokenizer.h"

namespace titan::data {

struct DataConfig {
  std::string dataset;       // fortunes | text | jsonl | tokens | c4 | c4_test
  std::string dataset_path;  // "" = the dataset's default (fortunes: /usr/share/games/fortunes)
  int64_t seq_len = 0;
  int64_t global_batch_size = 0;  // rows per optimizer step over all DP ranks
  int64_t seed = 0;               // document shuffle of epoch e uses seed + e
  int dp_rank = 0;
  int dp_degree = 1;
};

struct Batch {
  at::Tensor inputs;  // [global_batch_size / dp_degree, seq_len] int64, CPU
  at::Tensor labels;  // [global_batch_size / dp_degree, seq_len] int64, CPU; inputs shifted by 1
};

class DataLoader {
 public:
  // Reads (and for in-memory text datasets tokenizes) the whole dataset; a streamed corpus
  // (c4: Note [Streamed corpus]) opens its first file only. Throws std::runtime_error for a
  // bad config, an unreadable dataset, or a corpus shorter than one window.
  DataLoader(const DataConfig& config, const Tokenizer& tokenizer);

  // This rank's rows of the next global batch. Never runs out: epochs repeat.
  Batch next_batch();

  // The reader position as JSON text (batches consumed plus what it is only valid for).
  std::string state_dict() const;
  // Restores a position saved by state_dict(). Throws if it was saved for a different dataset,
  // seq_len, global_batch_size, seed or corpus size (the same position would be other tokens).
  void load_state_dict(const std::string& state);

  int64_t tokens_in_stream() const { return source_->size(); }  // tokens per epoch
  int64_t windows_per_epoch() const { return windows_per_epoch_; }
  int64_t batches_consumed() const { return batches_consumed_; }
  std::string describe() const;

 private:
  DataConfig config_;
  std::unique_ptr<TokenSource> source_;
  int64_t windows_per_epoch_ = 0;
  int64_t batches_consumed_ = 0;  // global batches handed out so far (the reader position)
};

}  // namespace titan::data
