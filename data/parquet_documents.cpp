// The Parquet side of the c4 datasets (c4_documents.h): a file's string column "text", one row
// group at a time, through the Arrow and Parquet C++ libraries that the pyarrow wheel ships
// (linked by cmake/Dependencies.cmake when TITAN_PARQUET is on). Arrow's headers stay inside
// this one file: they are large, and nothing else needs them.
#include "data/c4_documents.h"

#include <stdexcept>

#ifdef TITAN_WITH_PARQUET
#include <arrow/array/array_binary.h>
#include <arrow/chunked_array.h>
#include <arrow/io/file.h>
#include <arrow/memory_pool.h>
#include <arrow/table.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#endif

namespace titan::data {

#ifdef TITAN_WITH_PARQUET
namespace {

class ParquetStream final : public DocumentStream {
 public:
  explicit ParquetStream(std::string file) : file_(std::move(file)) {
    try {
      open();
    } catch (const std::runtime_error&) {
      throw;
    } catch (const std::exception& e) {  // parquet::ParquetException on a malformed footer
      fail(e.what());
    }
  }

  bool next(std::string& text) override {
    while (column_ == nullptr || chunk_ >= column_->num_chunks()) {
      if (row_group_ >= reader_->num_row_groups()) return false;
      load_row_group(row_group_++);
    }
    const arrow::Array& chunk = *column_->chunk(chunk_);
    if (chunk.IsNull(row_)) {
      fail("row group " + std::to_string(row_group_ - 1) + ": row " +
           std::to_string(rows_before_chunk_ + row_) + " has a null \"text\"");
    }
    if (large_) {
      text.assign(static_cast<const arrow::LargeBinaryArray&>(chunk).GetView(row_));
    } else {
      text.assign(static_cast<const arrow::BinaryArray&>(chunk).GetView(row_));
    }
    if (++row_ >= chunk.length()) {
      rows_before_chunk_ += chunk.length();
      row_ = 0;
      ++chunk_;
    }
    return true;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("Parquet dataset file " + file_ + ": " + what);
  }

  void check(const arrow::Status& status, const char* doing) const {
    if (!status.ok()) fail(std::string(doing) + ": " + status.ToString());
  }

  void open() {
    auto input = arrow::io::ReadableFile::Open(file_);
    check(input.status(), "cannot open");
    auto reader = parquet::arrow::OpenFile(*input, arrow::default_memory_pool());
    check(reader.status(), "not a readable Parquet file");
    reader_ = std::move(*reader);
    std::shared_ptr<arrow::Schema> schema;
    check(reader_->GetSchema(&schema), "cannot read its schema");
    const int field = schema->GetFieldIndex("text");
    if (field < 0) {
      std::string names;
      for (const auto& f : schema->fields()) names += (names.empty() ? "" : ", ") + f->name();
      fail("has no column \"text\" (its columns: " + names + ")");
    }
    const arrow::Type::type type = schema->field(field)->type()->id();
    large_ = type == arrow::Type::LARGE_STRING || type == arrow::Type::LARGE_BINARY;
    if (!large_ && type != arrow::Type::STRING && type != arrow::Type::BINARY) {
      fail("column \"text\" holds " + schema->field(field)->type()->ToString() +
           ", expected a string column");
    }
    // ReadRowGroup takes leaf-column indices; a top-level string field is one leaf.
    column_index_ = reader_->manifest().schema_fields[static_cast<size_t>(field)].column_index;
  }

  // Only one row group's "text" column is in memory at a time.
  void load_row_group(int group) {
    auto table = reader_->ReadRowGroup(group, {column_index_});
    check(table.status(), ("cannot read row group " + std::to_string(group)).c_str());
    column_ = (*table)->column(0);
    chunk_ = 0;
    row_ = 0;
    rows_before_chunk_ = 0;
  }

  std::string file_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  int column_index_ = 0;
  bool large_ = false;
  int row_group_ = 0;                            // the next row group to load
  std::shared_ptr<arrow::ChunkedArray> column_;  // the loaded row group's "text" column
  int chunk_ = 0;
  int64_t row_ = 0;                // within chunk_
  int64_t rows_before_chunk_ = 0;  // rows of the row group before chunk_
};

}  // namespace

std::unique_ptr<DocumentStream> open_parquet_documents(const std::string& file) {
  return std::make_unique<ParquetStream>(file);
}

bool parquet_supported() { return true; }

#else

std::unique_ptr<DocumentStream> open_parquet_documents(const std::string& file) {
  throw std::runtime_error("Parquet dataset file " + file +
                           ": this build of titan has no Parquet reader (configured with "
                           "TITAN_PARQUET=OFF, without the pyarrow wheel's Arrow libraries); "
                           "convert the data to JSON lines (*.json.gz) or build with "
                           "scripts/setup.sh");
}

bool parquet_supported() { return false; }

#endif

}  // namespace titan::data
