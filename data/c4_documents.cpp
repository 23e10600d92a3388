#include "data/c4_documents.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "util/file_kind.h"

namespace titan::data {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_parquet_file(const std::string& name) { return ends_with(name, ".parquet"); }

bool is_c4_file(const fs::path& p) {
  const std::string name = p.filename().string();
  return ends_with(name, ".json") || ends_with(name, ".jsonl") || ends_with(name, ".json.gz") ||
         ends_with(name, ".jsonl.gz") || is_parquet_file(name);
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// JSON lines, plain or gzip (gzopen reads plain files transparently, so one reader serves both).
class JsonLinesStream final : public DocumentStream {
 public:
  explicit JsonLinesStream(std::string file) : file_(std::move(file)) {
    in_.reset(gzopen(file_.c_str(), "rb"));
    if (!in_) throw std::runtime_error("cannot open c4 file " + file_);
    gzbuffer(in_.get(), 1 << 20);
  }

  bool next(std::string& text) override {
    std::string line;
    while (read_line(line)) {
      ++line_number_;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      text = json_line_text(line, "c4", file_ + ":" + std::to_string(line_number_));
      return true;
    }
    return false;
  }

 private:
  // One line without its '\n'; false at the end of the file. A decompression error (a cut or
  // corrupt .gz) throws: it must not read as a shorter dataset.
  bool read_line(std::string& line) {
    line.clear();
    char chunk[1 << 16];
    bool any = false;
    while (gzgets(in_.get(), chunk, sizeof(chunk)) != nullptr) {
      any = true;
      line += chunk;
      if (!line.empty() && line.back() == '\n') {
        line.pop_back();
        return true;
      }
    }
    int err = Z_OK;
    const char* message = gzerror(in_.get(), &err);
    if (err != Z_OK && err != Z_STREAM_END) {
      throw std::runtime_error("c4 file " + file_ + ": decompression failed after line " +
                               std::to_string(line_number_) + ": " + message);
    }
    return any;
  }

  std::string file_;
  std::unique_ptr<gzFile_s, GzCloser> in_;
  size_t line_number_ = 0;
};

}  // namespace

std::string json_line_text(std::string_view line, const std::string& dataset, const std::string& where) {
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(dataset + " dataset " + where + ": not valid JSON (" + e.what() + ")");
  }
  auto text = object.is_object() ? object.find("text") : object.end();
  if (!object.is_object() || text == object.end() || !text->is_string()) {
    throw std::runtime_error(dataset + " dataset " + where +
                             ": expected a JSON object with a string field \"text\"");
  }
  return text->get<std::string>();
}

std::vector<std::string> c4_files(const std::string& path) {
  std::error_code ec;
  if (path.empty()) {
    throw std::runtime_error(
        "the c4 datasets read a local copy: set training.dataset_path to a folder (or file) of "
        "JSON lines (*.json, *.json.gz as Hugging Face publishes allenai/c4) or Parquet files "
        "with a \"text\" column; titan ships no third-party data");
  }
  if (fs::is_regular_file(path, ec)) return {path};
  if (util::is_special_file(path)) {  // a FIFO would block the read, /dev/zero never ends
    throw std::runtime_error("c4 dataset path " + path + " is " + util::file_kind(path) +
                             ", not a regular file or a folder of JSON lines or Parquet files");
  }
  if (!fs::is_directory(path, ec)) {
    throw std::runtime_error("c4 dataset path " + path + " does not exist");
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && is_c4_file(entry.path())) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw std::runtime_error("c4 dataset folder " + path +
                             " holds no *.json, *.jsonl, *.json.gz, *.jsonl.gz or *.parquet files");
  }
  return files;
}

std::unique_ptr<DocumentStream> open_document_stream(const std::string& file) {
  if (is_parquet_file(file)) return open_parquet_documents(file);
  return std::make_unique<JsonLinesStream>(file);
}

std::vector<std::string> read_c4_documents(const std::string& path) {
  std::vector<std::string> documents;
  for (const std::string& file : c4_files(path)) {
    std::unique_ptr<DocumentStream> stream = open_document_stream(file);
    std::string text;
    while (stream->next(text)) documents.push_back(std::move(text));
  }
  if (documents.empty()) throw std::runtime_error("c4 dataset " + path + " holds no documents");
  return documents;
}

}  // namespace titan::data
