// trainer/config/toml_file.h — reading a config file safely, before toml++ sees it.
//
// Note [Config file limits]: a config file is read only when it is a regular file (a FIFO would
// block the read forever, /dev/zero never ends, a directory is a mistake), at most
// kMaxConfigFileBytes long (a real config is a few KiB; the largest torchtitan ships is under
// 10 KiB), and nested at most kMaxConfigNesting tables deep. The nesting limit is checked on the
// text, before parsing: toml++ builds a table per component of a dotted header or key and
// walks that chain recursively inside toml::parse, so `[training.a0. ... .a99999]` (690 KB)
// overflows the 8 MiB stack about 30,000 frames deep (a segfault, seen in gdb under
// toml::v3::ex::parse), which no catch can turn into an error. toml++'s own limit
// (TOML_MAX_NESTED_VALUES, 256) covers only inline arrays and tables, not dotted names.
// Every failure is a ConfigError naming the file.
#pragma once

#include <cstddef>
#include <string>

namespace titan::trainer::config {

inline constexpr size_t kMaxConfigFileBytes = size_t{16} << 20;  // 16 MiB
inline constexpr size_t kMaxConfigNesting = 64;  // tables: header components + dotted key
                                                 // components + inline tables and arrays

// The whole text of config file `path` (named as given by --job.config_file); throws
// ConfigError when it is missing, not a regular file, unreadable or longer than the limit.
std::string read_config_file_text(const std::string& path);

// The deepest nesting `text` asks toml++ to build (see Note [Config file limits]); an
// over-estimate on malformed text, which toml++ then rejects anyway.
size_t toml_nesting_depth(const std::string& text);

}  // namespace titan::trainer::config
