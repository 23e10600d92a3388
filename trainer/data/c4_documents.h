// trainer/data/c4_documents.h — the `c4` / `c4_test` datasets over a local copy, the way
// torchtitan users keep allenai/c4: JSON lines with a "text" field, plain (*.json, *.jsonl) or
// gzip-compressed (*.json.gz, *.jsonl.gz, as the Hugging Face dataset ships them). titan ships
// no third-party data: training.dataset_path names the file or folder (searched recursively,
// files in sorted path order).
//
// Files are decompressed and parsed line by line (zlib's gz reader), never read whole; the
// documents themselves are kept (the loader shuffles and tokenizes them), as for jsonl. An
// empty "text" is a document (BOS EOS), as in torchtitan.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace titan::trainer {

// The JSON-lines files a c4 path names: the file itself, or every *.json / *.jsonl /
// *.json.gz / *.jsonl.gz under the folder. Throws naming the path when there are none.
std::vector<std::string> c4_files(const std::string& path);

// Calls fn(text) for each "text" of `file` (plain or gzip, by its ".gz" name). Throws
// std::runtime_error naming file:line on a line that is not a JSON object with a string "text".
void for_each_c4_text(const std::string& file, const std::function<void(std::string&&)>& fn);

std::vector<std::string> read_c4_documents(const std::string& path);

}  // namespace titan::trainer
