// data/c4_documents.h — the `c4` / `c4_test` datasets over a local copy, the way
// torchtitan users keep Hugging Face datasets: JSON lines with a "text" field, plain (*.json,
// *.jsonl) or gzip-compressed (*.json.gz, *.jsonl.gz, as allenai/c4 ships), and Parquet files
// with a string column "text" (*.parquet, the form Hugging Face publishes most datasets in).
// titan ships no third-party data: training.dataset_path names the file or folder (searched
// recursively, files in sorted path order).
//
// Every file is read as a stream of documents, one at a time (zlib's gz reader line by line;
// Parquet one row group at a time through Arrow's reader), never whole. An empty "text" is a
// document (BOS EOS), as in torchtitan.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// The files a c4 path names: the file itself, or every *.json / *.jsonl / *.json.gz /
// *.jsonl.gz / *.parquet under the folder, in sorted path order. Throws naming the path when
// there are none.
std::vector<std::string> c4_files(const std::string& path);

// One file's documents, in file order.
class DocumentStream {
 public:
  virtual ~DocumentStream() = default;
  // The next document's text into `text`; false at the end of the file. Throws
  // std::runtime_error naming the file and the line (JSON) or row group (Parquet) on bad data.
  virtual bool next(std::string& text) = 0;
};

// Opens `file` by its name: *.parquet through the Parquet reader, anything else as JSON lines
// (plain or gzip: zlib reads both).
std::unique_ptr<DocumentStream> open_document_stream(const std::string& file);

// Opens a Parquet file's "text" column (data/parquet_documents.cpp). Builds without
// Arrow (TITAN_PARQUET=OFF) throw, saying so.
std::unique_ptr<DocumentStream> open_parquet_documents(const std::string& file);

// The string field "text" of one JSON-lines line (the jsonl and c4 datasets). Throws
// std::runtime_error "<dataset> dataset <where>: ..." when the line is not a JSON object with a
// string "text"; `where` is file:line.
std::string json_line_text(std::string_view line, const std::string& dataset, const std::string& where);

// Whether this build reads Parquet (it links the pyarrow wheel's Arrow and Parquet libraries).
bool parquet_supported();

// Every document of every c4 file, in memory (titan-tokenize shuffles them into a shard;
// training streams instead, see StreamingTokenSource). Throws when there are none.
std::vector<std::string> read_c4_documents(const std::string& path);

}  // namespace titan::data
