// data/streaming_source.h — a token stream read from files as training goes, for
// corpora that do not fit in memory (the c4 datasets: JSON lines, .json.gz, Parquet).
//
// Note [Streamed corpus]: the files are read in sorted path order, document by document, each
// document framed [BOS] ids [EOS] and tokenized when first needed; at the end of the last file
// the stream continues with the first file again (the next pass), so the stream is endless and
// has a single epoch, as torchtitan's streamed Hugging Face datasets (no shuffle; the files'
// own order). Only the tokens between the oldest window still to be read and the newest one
// read are held. A data-parallel rank reads its windows of each global batch (Note [Global
// batch order]) and skips the others' tokens, so every rank tokenizes the whole stream.
// The stream offset where each file of each pass began is recorded as it is read and travels in
// checkpoints (resume_hints): a resumed run starts reading at the latest file start at or before
// its position, re-reading at most one file; going back restarts the same way.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/c4_documents.h"
#include "data/token_source.h"
#include "data/tokenizer.h"

namespace titan::data {

class StreamingTokenSource final : public TokenSource {
 public:
  // `tokenizer` must outlive the source (it tokenizes as the stream is read).
  StreamingTokenSource(std::vector<std::string> files, const Tokenizer& tokenizer,
                       std::string origin);

  int64_t size() const override { return kEndlessTokens; }
  // Only epoch 0 exists. Not thread-safe (one loader per rank, one thread per loader).
  void read(int64_t epoch, int64_t offset, int64_t count, int64_t* out) const override;
  std::string describe() const override;
  bool endless() const override { return true; }
  std::string resume_hints() const override;
  void load_resume_hints(const std::string& hints) override;

  // Tokens the source holds right now (a bound on its memory, for tests).
  int64_t buffered_tokens() const { return static_cast<int64_t>(buffer_.size()); }

 private:
  // Appends the next document's framed tokens to buffer_ (opening the next file, or starting
  // the next pass, as needed).
  void pull_document() const;
  // Restarts reading at the latest known file start <= offset when `offset` lies before the
  // buffer, or when that start lies beyond the buffer's end (a resume: skip whole files).
  void seek_near(int64_t offset) const;

  std::vector<std::string> files_;
  const Tokenizer* tokenizer_;
  std::string origin_;
  std::vector<int64_t> file_bytes_;  // [files] sizes at construction (part of the fingerprint)

  // The stream's read position: file ordinal = pass * files + file.
  mutable int64_t next_ordinal_ = 0;             // the file to open when stream_ ends
  mutable std::unique_ptr<DocumentStream> stream_;
  mutable int64_t documents_this_pass_ = 0;
  mutable std::vector<int32_t> buffer_;          // tokens [buffer_begin_, buffer_begin_ + size)
  mutable int64_t buffer_begin_ = 0;
  mutable std::map<int64_t, int64_t> file_start_;  // file ordinal -> stream offset of its start
};

}  // namespace titan::data
