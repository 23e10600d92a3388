#include "trainer/data/c4_documents.h"
#include "util/file_kind.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace titan::trainer {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_json_lines_file(const fs::path& p) {
  const std::string name = p.filename().string();
  return ends_with(name, ".json") || ends_with(name, ".jsonl") || ends_with(name, ".json.gz") ||
         ends_with(name, ".jsonl.gz");
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

}  // namespace

std::vector<std::string> c4_files(const std::string& path) {
  std::error_code ec;
  if (path.empty()) {
    throw std::runtime_error(
        "the c4 datasets read a local copy: set training.dataset_path to a folder (or file) of "
        "c4 JSON lines (*.json, *.json.gz as Hugging Face publishes allenai/c4); titan ships no "
        "third-party data");
  }
  if (fs::is_regular_file(path, ec)) return {path};
  if (util::is_special_file(path)) {  // a FIFO would block the read, /dev/zero never ends
    throw std::runtime_error("c4 dataset path " + path + " is " + util::file_kind(path) +
                             ", not a regular file or a folder of JSON lines");
  }
  if (!fs::is_directory(path, ec)) {
    throw std::runtime_error("c4 dataset path " + path + " does not exist");
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && is_json_lines_file(entry.path())) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  bool parquet = false;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    parquet |= entry.path().extension() == ".parquet";
  }
  if (files.empty() && parquet) {
    throw std::runtime_error("c4 dataset folder " + path +
                             " holds Parquet files; titan does not implement Parquet datasets "
                             "yet (JSON lines, plain or .json.gz, are read)");
  }
  if (files.empty()) {
    throw std::runtime_error("c4 dataset folder " + path +
                             " holds no *.json, *.jsonl, *.json.gz or *.jsonl.gz files");
  }
  return files;
}

void for_each_c4_text(const std::string& file, const std::function<void(std::string&&)>& fn) {
  // gzopen reads plain files too (transparently), so one reader serves both forms.
  std::unique_ptr<gzFile_s, GzCloser> in(gzopen(file.c_str(), "rb"));
  if (!in) throw std::runtime_error("cannot open c4 file " + file);
  gzbuffer(in.get(), 1 << 20);
  std::string line;
  char chunk[1 << 16];
  size_t line_number = 0;
  auto finish_line = [&] {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;
    const std::string where = file + ":" + std::to_string(line_number);
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error("c4 dataset " + where + ": not valid JSON (" + e.what() + ")");
    }
    auto text = object.is_object() ? object.find("text") : object.end();
    if (!object.is_object() || text == object.end() || !text->is_string()) {
      throw std::runtime_error("c4 dataset " + where +
                               ": expected a JSON object with a string field \"text\"");
    }
    fn(text->get<std::string>());
  };
  while (gzgets(in.get(), chunk, sizeof(chunk)) != nullptr) {
    line += chunk;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      finish_line();
      line.clear();
    }
  }
  int err = Z_OK;
  const char* message = gzerror(in.get(), &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    throw std::runtime_error("c4 file " + file + ": decompression failed after line " +
                             std::to_string(line_number) + ": " + message);
  }
  if (!line.empty()) finish_line();
}

std::vector<std::string> read_c4_documents(const std::string& path) {
  std::vector<std::string> documents;
  for (const std::string& file : c4_files(path)) {
    for_each_c4_text(file, [&](std::string&& text) { documents.push_back(std::move(text)); });
  }
  if (documents.empty()) throw std::runtime_error("c4 dataset " + path + " holds no documents");
  return documents;
}

}  // namespace titan::trainer
