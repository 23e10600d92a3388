// trainer/config/parse_state.h — what the config's layers share while one parse runs (internal
// to titan_config): where each key was last set, the problems found so far, and the helpers both
// the TOML layer (toml_layer.cpp) and the command-line layer (job_config.cpp) name keys with.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "trainer/config/key_table.h"

namespace titan::trainer::config::detail {

inline constexpr const char* kCommandLine = "command line";

using Origins = std::map<std::string, std::string>;  // dotted key -> where it was last set

// Every problem of one parse, in the order found; parse_job_config throws them as one
// ConfigError, one line each, so a user fixes a config in one pass rather than one run per line.
struct Problems {
  std::vector<std::string> lines;
  void add(const std::string& where, const std::string& what) { lines.push_back(where + ": " + what); }
};

// What the layers fill in, besides the config itself.
struct ParseState {
  JobConfig& cfg;
  Origins origins;
  Problems problems;
};

// The valid key closest to `section.name` ("" section: a key given without one). An exact key
// name in another section beats any spelling distance, because `training.lr` almost always
// means `optimizer.lr`; among those, the closest section wins (`optimiser.name`). Only titan's
// own keys are suggested: torchtitan's other names are found by exact match or not at all.
std::string closest_key(const std::string& section, const std::string& name);
std::string closest_section(const std::string& name);
std::string unknown_key_message(const std::string& section, const std::string& name);

// Where a value came from, for the origin of the key it lands in: an alias says its own name.
std::string origin_of(const KeySpec& spec, const std::string& where);
// The key a value is stored under (an alias stores into its target).
std::string stored_key(const KeySpec& spec);
// A note on the config that an alias was given, and which key it became.
void note_alias(JobConfig& cfg, const KeySpec& spec, const std::string& where);

// A comma-separated list, items trimmed, empty items dropped (a list key's text form).
std::vector<std::string> split_list(const std::string& text);

// The TOML layer (toml_layer.cpp): every key of config file `path` into st.cfg, its origin
// "path:line"; throws ConfigError when the file cannot be read or is not TOML.
void apply_toml_file(ParseState& st, const std::string& path);

}  // namespace titan::trainer::config::detail
