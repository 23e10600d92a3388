// trainer/config/key_table.h — the schema behind JobConfig (internal to titan_config).
//
// A KeySpec describes one key: name, type, help, allowed values, and how to reach the struct
// member it binds. The table itself (keys.cpp) is built with `section(...)` and
// `key(...)` below so that a row reads like a declaration:
//
//   key("steps", &TrainingSection::steps, "Number of optimizer steps.").at_least(1),
//
// The key's type comes from the member's type and its default from the member initializer,
// so neither can drift from the struct.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "trainer/config/job_config.h"

namespace titan::trainer::config::detail {

enum class ValueType { kBool, kInt, kFloat, kString, kStringList };

// Upper bounds of integer keys (Note [Every integer key has an upper bound]).
// Counts (steps, batch rows, tokens per sequence, threads, degrees, ranks): what an int holds.
inline constexpr double kMaxCount = 2147483647.0;  // 2^31 - 1
// Timeouts in seconds: 30 days. Far beyond any real wait, and far below where seconds -> ms
// (std::chrono, Gloo) would overflow int64.
inline constexpr double kMaxTimeoutSeconds = 30.0 * 24 * 3600;

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

// Note [torchtitan's schema in the key table]: every key of torchtitan's TOML schema from the
// seed era through v0.2.2 has a row, of one of three kinds:
//   kImplemented  a titan key, bound to a JobConfig member (same meaning as torchtitan's);
//   kAlias        another name of a titan key (an older torchtitan name, or a section that
//                 moved); the value goes to the target, and a note says which key it became;
//   kAccepted     a torchtitan key titan has no member for: accepted when its value asks for
//                 nothing titan lacks (`enable = false`, degree 1, or any value of a setting that
//                 only matters to a feature titan does not have), else refused with "titan does
//                 not implement <feature> yet". The value is kept in JobConfig::torchtitan_values.
// `versions` says which torchtitan releases have the key, for --help and the notes.
enum class KeyKind { kImplemented, kAlias, kAccepted };

struct KeySpec {
  std::string section;  // filled in by section(); may contain dots ("quantize.linear.float8")
  std::string name;
  std::string help;
  ValueType type = ValueType::kString;
  std::function<ValueRef(JobConfig&)> ref;
  std::optional<Range> range;
  std::vector<std::string> choices;  // for strings, and for each item of a list
  std::string ignored_reason;        // non-empty: accepted but has no effect in titan
  bool cli_only = false;             // may not appear in a config file
  bool non_empty = false;            // strings: "" is refused
  KeyKind kind = KeyKind::kImplemented;
  std::string versions;  // torchtitan releases with this key ("" = every one / titan's own)
  // Values of torchtitan's that name a titan value ("quantize.linear.float8" -> "float8").
  std::vector<std::pair<std::string, std::string>> value_aliases;
  // Values accepted by name whose feature titan lacks: value -> the feature.
  std::vector<std::pair<std::string, std::string>> unimplemented_values;
  // kAlias:
  std::string alias_of;        // dotted name of the titan key
  bool alias_negates = false;  // a boolean that means the opposite (metrics.rank_0_only)
  // kAccepted:
  std::optional<ConfigValue> default_value;
  std::vector<ConfigValue> inert_values;  // empty = any value is inert
  std::string missing_feature;            // what a non-inert value asks for
  std::string advice;                     // what to do instead, if anything

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
const KeySpec* find_key(const std::string& dotted);  // split at the last '.'
// True when some section's name starts with `prefix` + "." (a TOML table that holds sections,
// like [quantize] or [quantize.linear]).
bool is_section_prefix(const std::string& prefix);

// ---- value helpers shared by parsing and printing ----
const char* type_name(ValueType type);        // "bool", "int", "float", "string", "list of strings"
const char* type_phrase(ValueType type);      // "a boolean (true/false)", "an integer", ...
std::string format_float(double v);           // shortest text that reads back as the same double
std::string quote_toml(const std::string& s);  // a TOML basic string, escapes included
std::string format_value(const KeySpec& spec, const JobConfig& cfg);  // as TOML
std::string format_config_value(const ConfigValue& value);            // as TOML
bool equals_default(const KeySpec& spec, const JobConfig& cfg);

// ---- table builders (used by keys.cpp) ----
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
struct Row;

template <class S>
struct KeyRow {
  KeySpec spec;
  std::function<ValueRef(S&)> member_ref;  // empty for alias and accepted rows

  KeyRow() = default;
  KeyRow(Row&& row);  // NOLINT: implicit, so alias/accepted rows mix with key() rows

  KeyRow&& at_least(double lo) && { return bounded(lo, false, std::nullopt, false); }
  KeyRow&& above(double lo) && { return bounded(lo, true, std::nullopt, false); }
  KeyRow&& in_closed(double lo, double hi) && { return bounded(lo, false, hi, false); }
  KeyRow&& in_half_open(double lo, double hi) && { return bounded(lo, false, hi, true); }
  // Note [Every integer key has an upper bound]: values are int64 in the config, but their
  // users hold them in narrower types (int threads, steps and ranks; chrono durations in ms;
  // products such as local_batch_size x seq_len), so every integer row states its largest value
  // and the check refuses anything above it by name instead of letting it wrap
  // (tests/test_config.cpp checks the table for integer rows without one).
  KeyRow&& count_at_least(double lo) && { return bounded(lo, false, kMaxCount, false); }
  // Also allow `v`, outside the bounds (call after the bound).
  KeyRow&& or_exactly(double v) && {
    spec.range.value().sentinel = v;
    return std::move(*this);
  }
  // A string that may not be "" (folders under job.dump_folder, the dump folder itself).
  KeyRow&& non_empty() && {
    spec.non_empty = true;
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
  // torchtitan writes `from`; titan calls it `to`.
  KeyRow&& value_alias(std::string from, std::string to) && {
    spec.value_aliases.emplace_back(std::move(from), std::move(to));
    return std::move(*this);
  }
  // A value torchtitan has whose feature titan lacks: refused by name, not as "not allowed".
  KeyRow&& unimplemented_value(std::string value, std::string feature) && {
    spec.unimplemented_values.emplace_back(std::move(value), std::move(feature));
    return std::move(*this);
  }

 private:
  KeyRow&& bounded(std::optional<double> lo, bool lo_open, std::optional<double> hi,
                   bool hi_open) {
    spec.range = Range{lo, hi, lo_open, hi_open, std::nullopt};
    return std::move(*this);
  }
};

// A row bound to no member: an alias or an accepted torchtitan key. Converts to KeyRow<S> so it
// can sit in any section's row list.
struct Row {
  KeySpec spec;
  Row&& in_versions(std::string versions) && {
    spec.versions = std::move(versions);
    return std::move(*this);
  }
  // What to do instead, said in --help and in the refusal.
  Row&& advising(std::string advice) && {
    if (!spec.help.empty() && spec.help.back() == '.') spec.help.pop_back();
    spec.help += "; " + advice + ".";
    spec.advice = std::move(advice);
    return std::move(*this);
  }
  Row&& negated() && {
    spec.alias_negates = true;
    return std::move(*this);
  }
};

// `name` is torchtitan's name of titan's `target` key (dotted); its type is the target's.
inline Row alias(const char* name, const char* target, const char* versions) {
  Row row;
  row.spec.name = name;
  row.spec.kind = KeyKind::kAlias;
  row.spec.alias_of = target;
  row.spec.versions = versions;
  return row;
}

inline ConfigValue as_config_value(bool v) { return v; }
inline ConfigValue as_config_value(int v) { return int64_t{v}; }
inline ConfigValue as_config_value(int64_t v) { return v; }
inline ConfigValue as_config_value(double v) { return v; }
inline ConfigValue as_config_value(const char* v) { return std::string(v); }
inline ConfigValue as_config_value(std::vector<std::string> v) { return v; }

// A torchtitan key accepted only with the value `inert` (its torchtitan default, which asks
// for nothing); any other value is refused: "titan does not implement <feature> yet".
template <class T>
Row accepted_if(const char* name, T inert, const char* feature, const char* versions) {
  Row row;
  row.spec.name = name;
  row.spec.kind = KeyKind::kAccepted;
  row.spec.default_value = as_config_value(inert);
  row.spec.inert_values = {*row.spec.default_value};
  row.spec.missing_feature = feature;
  row.spec.help = std::string("torchtitan's key; accepted only as ") +
                  format_config_value(*row.spec.default_value) + " (titan does not implement " +
                  feature + ").";
  row.spec.versions = versions;
  return row;
}

// A torchtitan key accepted with any value, because it only matters to something titan does
// not have or does regardless (`why`); `default_value` is torchtitan's default.
template <class T>
Row accepted_any(const char* name, T default_value, const char* why, const char* versions) {
  Row row;
  row.spec.name = name;
  row.spec.kind = KeyKind::kAccepted;
  row.spec.default_value = as_config_value(default_value);
  row.spec.help = std::string("torchtitan's key; any value is accepted: ") + why + ".";
  row.spec.versions = versions;
  return row;
}

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
KeyRow<S>::KeyRow(Row&& row) : spec(std::move(row.spec)) {}

template <class S>
SectionSpec section(const char* name, S JobConfig::*member, const char* help,
                    std::vector<KeyRow<S>> rows) {
  SectionSpec out{name, help, {}};
  for (auto& row : rows) {
    KeySpec spec = std::move(row.spec);
    spec.section = name;
    if (row.member_ref) {
      spec.ref = [member, f = std::move(row.member_ref)](JobConfig& c) { return f(c.*member); };
    }
    out.keys.push_back(std::move(spec));
  }
  return out;
}

// A torchtitan section titan has no struct for: only alias and accepted rows.
SectionSpec torchtitan_section(const char* name, const char* help, std::vector<Row> rows);

// relations.cpp: problems (where, what) that involve several keys or the machine
// (`origins`: dotted key -> where it was last set), and the start-up warnings of settings that
// do nothing (warmup longer than the run, profiling that never fires), appended to cfg.warnings.
std::vector<std::pair<std::string, std::string>> check_key_relations(
    const JobConfig& cfg, const std::map<std::string, std::string>& origins, const MachineFacts& machine);
void add_start_up_warnings(JobConfig& cfg);

// keys_torchtitan.cpp: torchtitan's rows for titan's section `section`, and
// torchtitan's sections titan has no struct for.
std::vector<Row> torchtitan_rows(const std::string& section);
std::vector<SectionSpec> torchtitan_sections();

}  // namespace titan::trainer::config::detail
