// data/documents.h — reads the raw text documents of the text datasets.
//
//   fortunes  the Debian `fortunes` package's folder: every plain file without an extension
//             (not *.dat / *.u8, not the "art" and "ascii-art" pictures, no symlinks or
//             folders) holds documents separated by lines that are exactly "%".
//   text      one .txt file, or a folder of *.txt files (not recursive): one file = one document.
//   jsonl     one .jsonl file, or a folder of *.jsonl files (not recursive): one JSON object per
//             line, its string field "text" is a document; blank lines are skipped.
// Files are read in sorted path order, so the document list is the same on every rank and run.
// Empty fortunes (whitespace-only) and empty .txt files are dropped; an empty jsonl "text" is a
// document (BOS EOS), as in torchtitan's dataset and titan's c4 reader.
#pragma once

#include <string>
#include <vector>

namespace titan::data {

// The fortunes folder used when dataset_path is empty (scripts/setup.sh installs the package).
extern const char* const kFortunesDir;

// `format` is "fortunes", "text" or "jsonl"; `path` "" means the format's default (fortunes
// only). Throws std::runtime_error naming the path (and for jsonl the line) on any problem,
// including a dataset with no documents.
std::vector<std::string> read_documents(const std::string& format, const std::string& path);

std::vector<std::string> read_fortunes(const std::string& dir);
std::vector<std::string> read_text_documents(const std::string& path);
std::vector<std::string> read_jsonl_documents(const std::string& path);

}  // namespace titan::data
