#include "data/documents.h"
#include "data/c4_documents.h"
#include "data/text_lines.h"
#include "util/file_kind.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace titan::data {

const char* const kFortunesDir = "/usr/share/games/fortunes";

namespace {

namespace fs = std::filesystem;

// Regular (non-symlink) files of `dir` whose name passes `keep`, in sorted order.
std::vector<fs::path> list_files(const fs::path& dir, bool (*keep)(const fs::path&)) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (keep(entry.path())) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A file given directly is taken whatever its name; a folder contributes its files with `ext`.
std::vector<fs::path> resolve_inputs(const std::string& path, const char* what,
                                     bool (*keep)(const fs::path&), const char* ext) {
  std::error_code ec;
  if (path.empty()) {
    throw std::runtime_error(std::string("the ") + what +
                             " dataset needs a path (training.dataset_path, or titan-tokenize "
                             "--input): a file or a folder of *" + ext + " files");
  }
  if (fs::is_regular_file(path, ec)) return {fs::path(path)};
  if (util::is_special_file(path)) {  // a FIFO would block the read, /dev/zero never ends
    throw std::runtime_error(std::string(what) + " dataset path " + path + " is " +
                             util::file_kind(path) + ", not a regular file or a folder of *" +
                             ext + " files");
  }
  if (!fs::is_directory(path, ec)) {
    throw std::runtime_error(std::string(what) + " dataset path " + path +
                             " does not exist (expected a file or a folder of *" + ext +
                             " files)");
  }
  std::vector<fs::path> files = list_files(path, keep);
  if (files.empty()) {
    throw std::runtime_error(std::string(what) + " dataset folder " + path + " holds no *" + ext +
                             " files");
  }
  return files;
}

bool is_fortune_file(const fs::path& path) {
  const std::string name = path.filename().string();
  // Extensionless files are the fortune texts; *.dat are strfile indexes, *.u8 UTF-8 links.
  // "art"/"ascii-art" are pictures, not prose.
  return name.find('.') == std::string::npos && name != "art" && name != "ascii-art";
}

bool has_txt_extension(const fs::path& path) { return path.extension() == ".txt"; }
bool has_jsonl_extension(const fs::path& path) { return path.extension() == ".jsonl"; }

bool is_blank(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

}  // namespace

std::vector<std::string> read_fortunes(const std::string& dir) {
  const std::string folder = dir.empty() ? kFortunesDir : dir;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    if (fs::exists(folder, ec))  // the path is there, but it is no folder
      throw std::runtime_error("training.dataset_path " + folder + " is " + util::file_kind(folder) +
                               ", but the fortunes dataset reads a folder of fortune files: point it at "
                               "the folder that holds them (default " + std::string(kFortunesDir) + ")");
    throw std::runtime_error("fortunes dataset folder " + folder +
                             " not found: run scripts/setup.sh (it installs the Debian package "
                             "'fortunes'), or point training.dataset_path at a folder of "
                             "fortune files");
  }
  std::vector<std::string> documents;
  for (const fs::path& file : list_files(folder, is_fortune_file)) {
    const std::string content = read_whole_file(file.string());
    // A document is its lines between "%" lines, joined by '\n' (no trailing newline).
    std::string document;
    bool has_line = false;
    for_each_line(content, [&](std::string_view line, size_t) {
      if (line == "%") {
        if (!is_blank(document)) documents.push_back(std::move(document));
        document.clear();
        has_line = false;
        return;
      }
      if (has_line) document += '\n';
      document += line;
      has_line = true;
    });
    if (!is_blank(document)) documents.push_back(std::move(document));
  }
  if (documents.empty()) {
    throw std::runtime_error("fortunes dataset folder " + folder +
                             " holds no fortune files (extensionless files with '%' lines)");
  }
  return documents;
}

std::vector<std::string> read_text_documents(const std::string& path) {
  std::vector<std::string> documents;
  for (const fs::path& file : resolve_inputs(path, "text", has_txt_extension, ".txt")) {
    std::string content = read_whole_file(file.string());
    if (!content.empty()) documents.push_back(std::move(content));
  }
  if (documents.empty()) throw std::runtime_error("text dataset " + path + " has only empty files");
  return documents;
}

std::vector<std::string> read_jsonl_documents(const std::string& path) {
  std::vector<std::string> documents;
  for (const fs::path& file : resolve_inputs(path, "jsonl", has_jsonl_extension, ".jsonl")) {
    const std::string content = read_whole_file(file.string());
    for_each_line(content, [&](std::string_view line, size_t line_number) {
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
      // An empty "text" is a document all the same: its tokens are BOS EOS, as torchtitan's
      // dataset yields them (the c4 reader keeps it too), so both token streams agree.
      documents.push_back(json_line_text(line, "jsonl", file.string() + ":" + std::to_string(line_number)));
    });
  }
  if (documents.empty()) {
    throw std::runtime_error("jsonl dataset " + path + " holds no documents (no JSON lines with a \"text\" field)");
  }
  return documents;
}

std::vector<std::string> read_documents(const std::string& format, const std::string& path) {
  if (format == "fortunes") return read_fortunes(path);
  if (format == "text") return read_text_documents(path);
  if (format == "jsonl") return read_jsonl_documents(path);
  if (format == "c4" || format == "c4_test") return read_c4_documents(path);
  throw std::runtime_error("unknown text dataset format '" + format +
                           "' (allowed: fortunes, text, jsonl, c4, c4_test)");
}

}  // namespace titan::data
