// trainer/config/toml_layer.cpp — the config file's layer of parse_job_config: every key of a
// TOML file stored into the config with "file:line" as its origin, each problem (a wrong type, an
// unknown key or section, a key outside any section) named by its line, in file order.
#include <algorithm>
#include <sstream>

#include <toml++/toml.h>

#include "trainer/config/parse_state.h"
#include "trainer/config/toml_file.h"

namespace titan::trainer::config::detail {
namespace {

std::string toml_type_phrase(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string toml_value_text(const toml::node& node) {
  std::ostringstream os;
  node.visit([&](const auto& n) { os << n; });
  std::string s = os.str();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string toml_where(const std::string& path, const toml::source_region& src) {
  return src.begin.line > 0 ? path + ":" + std::to_string(src.begin.line) : path;
}

// Stores `node` into the key's slot; a wrong type is a problem and leaves the slot alone.
bool apply_toml_value(ParseState& st, const KeySpec& spec, const toml::node& node,
                      const std::string& where) {
  ValueRef ref = spec.get(st.cfg);
  auto type_problem = [&] {
    st.problems.add(where, spec.dotted() + " expects " + type_phrase(spec.type) + ", got " +
                               toml_type_phrase(node) + " (" + toml_value_text(node) + ")");
    return false;
  };
  switch (spec.type) {
    case ValueType::kBool:
      if (!node.is_boolean()) return type_problem();
      *std::get<bool*>(ref) = node.as_boolean()->get() != spec.alias_negates;
      break;
    case ValueType::kInt:
      if (!node.is_integer()) return type_problem();
      *std::get<int64_t*>(ref) = node.as_integer()->get();
      break;
    case ValueType::kFloat:
      if (node.is_integer()) {
        *std::get<double*>(ref) = static_cast<double>(node.as_integer()->get());
      } else if (node.is_floating_point()) {
        *std::get<double*>(ref) = node.as_floating_point()->get();
      } else {
        return type_problem();
      }
      break;
    case ValueType::kString:
      if (!node.is_string()) return type_problem();
      *std::get<std::string*>(ref) = node.as_string()->get();
      break;
    case ValueType::kStringList: {
      // torchtitan reads a string for a list key as a comma-separated list
      // (`converters = "float8"` in its early-2025 configs).
      if (node.is_string()) {
        *std::get<std::vector<std::string>*>(ref) = split_list(node.as_string()->get());
        break;
      }
      if (!node.is_array()) return type_problem();
      std::vector<std::string> items;
      for (const toml::node& item : *node.as_array()) {
        // module_fqns_per_model_part is a list of lists (one per stage): a stage's modules are
        // held as one item, separated by spaces.
        if (item.is_array() && spec.dotted() == "parallelism.module_fqns_per_model_part") {
          std::string stage;
          for (const toml::node& module : *item.as_array()) {
            if (!module.is_string()) {
              st.problems.add(where, spec.dotted() + " expects lists of module names, but stage " +
                                         std::to_string(items.size()) + " holds " + toml_type_phrase(module) +
                                         " (" + toml_value_text(module) + ")");
              return false;
            }
            stage += (stage.empty() ? "" : " ") + module.as_string()->get();
          }
          items.push_back(stage);
          continue;
        }
        if (!item.is_string()) {
          st.problems.add(where, spec.dotted() + " expects a list of strings, but item " +
                                     std::to_string(items.size()) + " is " +
                                     toml_type_phrase(item) + " (" + toml_value_text(item) + ")");
          return false;
        }
        items.push_back(item.as_string()->get());
      }
      *std::get<std::vector<std::string>*>(ref) = std::move(items);
      break;
    }
  }
  return true;
}

toml::table read_toml_file(const std::string& path) {
  const std::string text = read_config_file_text(path);
  if (const size_t depth = toml_nesting_depth(text); depth > kMaxConfigNesting) {
    throw ConfigError("config file '" + path + "' nests tables " + std::to_string(depth) +
                      " deep (dotted headers/keys and inline tables); the limit is " +
                      std::to_string(kMaxConfigNesting));
  }
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& pos = e.source().begin;
    throw ConfigError("config file '" + path + "' is not valid TOML: line " +
                      std::to_string(pos.line) + ", column " + std::to_string(pos.column) +
                      ": " + std::string(e.description()));
  }
}

// toml++ tables iterate in key order; problems should come in file order instead.
template <class Table>
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const Table& table) {
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  for (auto&& [k, v] : table) entries.emplace_back(&k, &v);
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto &pa = a.first->source().begin, &pb = b.first->source().begin;
    return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
  });
  return entries;
}

// One TOML table whose dotted name is `prefix` ("" = the document): sub-tables are sections
// ([training], [quantize.linear.float8]) or tables that hold sections ([quantize]); values are
// keys of the section `prefix`.
void apply_toml_table(ParseState& st, const toml::table& table, const std::string& prefix,
                      const std::string& path) {
  for (const auto& [key_ptr, node_ptr] : in_file_order(table)) {
    const toml::key& key = *key_ptr;
    const toml::node& node = *node_ptr;
    const std::string name(key.str());
    const std::string full = prefix.empty() ? name : prefix + "." + name;
    const std::string where = toml_where(path, key.source());
    const bool names_section = find_section(full) != nullptr || is_section_prefix(full);
    if (node.is_table()) {
      if (names_section) {
        apply_toml_table(st, *node.as_table(), full, path);
      } else {
        st.problems.add(where, "unknown config section [" + full + "] (did you mean [" +
                                   closest_section(full) + "]?); --help lists every section");
      }
      continue;
    }
    if (names_section) {
      st.problems.add(where, "'" + full + "' must be a [" + full + "] table, got " +
                                 toml_type_phrase(node));
      continue;
    }
    if (prefix.empty()) {
      st.problems.add(where, "top-level key '" + name + "' is outside any section; keys go "
                             "under a [section] header (did you mean '" +
                             closest_key("", name) + "'?)");
      continue;
    }
    const KeySpec* spec = find_key(prefix, name);
    if (spec == nullptr) {
      st.problems.add(where, unknown_key_message(prefix, name));
      continue;
    }
    // A file naming another file would make precedence depend on nesting; keep one level.
    if (spec->cli_only) {
      st.problems.add(where, spec->dotted() + " can only be given on the command line, not in "
                             "a config file");
      continue;
    }
    if (apply_toml_value(st, *spec, node, where)) {
      st.origins[stored_key(*spec)] = origin_of(*spec, where);
      note_alias(st.cfg, *spec, where);
    }
  }
}

}  // namespace

void apply_toml_file(ParseState& st, const std::string& path) {
  apply_toml_table(st, read_toml_file(path), "", path);
}


}  // namespace titan::trainer::config::detail
