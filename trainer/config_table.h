// trainer/config_table.h — the schema behind JobConfig (internal to titan_config).
//
// A KeySpec describes one key: name, type, help, allowed values, and how to reach the struct
// member it binds. The table itself (config_keys.cpp) is built with `section(...)` and
// `key(...)` below so that a row reads like a declaration:
//
//   key("steps", &TrainingSection::steps, "Number of optimizer steps.").at_least(1),
//
// The key's type comes from the member's type and its default from the member initializer,
// so neither can drift from the struct.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "trainer/config.h"

namespace titan::trainer::config_detail {

enum class ValueType { kBool, kInt, kFloat, kString, kStringList };

// A pointer to the bound member of one JobConfig; the alternative matches KeySpec::type.
using ValueRef = std::variant<bool*, int64_t*, double*, std::string*, std::vector<std::string>*>;

// Numeric bounds, optionally with one extra allowed value outside them (a sentinel such as
// -1 = "automatic"), because several torchtitan keys use one.
struct Range {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  std::optional<double> sentinel;

  bool contains(double v) const;
  std::string describe() const;  // ">= 1", "in [0, 1)", "-1 or in [0, 1]"
};

struct KeySpec {
  std::string section;  // filled in by section()
  std::string name;
  std::string help;
  ValueType type = ValueType::kString;
  std::function<ValueRef(JobConfig&)> ref;
  std::optional<Range> range;
  std::vector<std::string> choices;  // for strings, and for each item of a list
  std::string ignored_reason;        // non-empty: accepted but has no effect in titan
  bool cli_only = false;             // may not appear in a config file

  std::string dotted() const { return section + "." + name; }
  ValueRef get(JobConfig& cfg) const { return ref(cfg); }
  ValueRef get(const JobConfig& cfg) const { return ref(const_cast<JobConfig&>(cfg)); }
};

struct SectionSpec {
  std::string name;
  std::string help;
  std::vector<KeySpec> keys;
};

// Every section in JobConfig order, each with its keys in declaration order.
const std::vector<SectionSpec>& config_table();
const SectionSpec* find_section(const std::string& name);
const KeySpec* find_key(const std::string& section, const std::string& name);

// ---- value helpers shared by parsing and printing ----
const char* type_name(ValueType type);        // "bool", "int", "float", "string", "list of strings"
const char* type_phrase(ValueType type);      // "a boolean (true/false)", "an integer", ...
std::string format_float(double v);           // shortest text that reads back as the same double
std::string quote_toml(const std::string& s);  // a TOML basic string, escapes included
std::string format_value(const KeySpec& spec, const JobConfig& cfg);  // as TOML
bool equals_default(const KeySpec& spec, const JobConfig& cfg);

// ---- table builders (used by config_keys.cpp) ----
template <class T>
constexpr ValueType value_type_of();
template <> constexpr ValueType value_type_of<bool>() { return ValueType::kBool; }
template <> constexpr ValueType value_type_of<int64_t>() { return ValueType::kInt; }
template <> constexpr ValueType value_type_of<double>() { return ValueType::kFloat; }
template <> constexpr ValueType value_type_of<std::string>() { return ValueType::kString; }
template <> constexpr ValueType value_type_of<std::vector<std::string>>() {
  return ValueType::kStringList;
}

// A key row bound to a member of section struct S; S is checked against the enclosing
// section() at compile time, so a row cannot be filed under the wrong section.
template <class S>
struct KeyRow {
  KeySpec spec;
  std::function<ValueRef(S&)> member_ref;

  KeyRow&& at_least(double lo) && { return bounded(lo, false, std::nullopt, false); }
  KeyRow&& above(double lo) && { return bounded(lo, true, std::nullopt, false); }
  KeyRow&& in_closed(double lo, double hi) && { return bounded(lo, false, hi, false); }
  KeyRow&& in_half_open(double lo, double hi) && { return bounded(lo, false, hi, true); }
  // Also allow `v`, outside the bounds (call after the bound).
  KeyRow&& or_exactly(double v) && {
    spec.range.value().sentinel = v;
    return std::move(*this);
  }
  KeyRow&& one_of(std::vector<std::string> choices) && {
    spec.choices = std::move(choices);
    return std::move(*this);
  }
  // Accepted so that torchtitan command lines and files still work; setting it to anything
  // but its default records `reason` as a warning.
  KeyRow&& ignored(std::string reason) && {
    spec.ignored_reason = std::move(reason);
    return std::move(*this);
  }
  KeyRow&& command_line_only() && {
    spec.cli_only = true;
    return std::move(*this);
  }

 private:
  KeyRow&& bounded(std::optional<double> lo, bool lo_open, std::optional<double> hi,
                   bool hi_open) {
    spec.range = Range{lo, hi, lo_open, hi_open, std::nullopt};
    return std::move(*this);
  }
};

template <class S, class T>
KeyRow<S> key(const char* name, T S::*member, const char* help) {
  KeyRow<S> row;
  row.spec.name = name;
  row.spec.help = help;
  row.spec.type = value_type_of<T>();
  row.member_ref = [member](S& s) -> ValueRef { return &(s.*member); };
  return row;
}

template <class S>
SectionSpec section(const char* name, S JobConfig::*member, const char* help,
                    std::vector<KeyRow<S>> rows) {
  SectionSpec out{name, help, {}};
  for (auto& row : rows) {
    KeySpec spec = std::move(row.spec);
    spec.section = name;
    spec.ref = [member, f = std::move(row.member_ref)](JobConfig& c) { return f(c.*member); };
    out.keys.push_back(std::move(spec));
  }
  return out;
}

}  // namespace titan::trainer::config_detail
