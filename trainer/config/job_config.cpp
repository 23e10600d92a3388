// trainer/config/job_config.cpp — parse_job_config: defaults < TOML file < command line, then validate.
// The command-line layer and the validation live here; the TOML layer in toml_layer.cpp.
//
// Values are applied layer by layer while remembering where each key was last set
// ("configs/x.toml:12" or "command line"); validation runs once on the merged result, so a bad
// value in a file that the command line overrides is not an error, and every error says where
// the offending value came from.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <thread>

#include <ATen/Context.h>

#include "trainer/config/key_table.h"
#include "trainer/config/parse_state.h"
#include "util/edit_distance.h"

namespace titan::trainer::config {

using namespace detail;

namespace detail {

using titan::util::edit_distance;

std::string closest_key(const std::string& section, const std::string& name) {
  std::string best;
  size_t best_score = SIZE_MAX;
  for (const auto& s : config_table()) {
    for (const auto& k : s.keys) {
      if (k.kind != KeyKind::kImplemented) continue;
      const size_t section_distance = section.empty() ? 0 : edit_distance(section, s.name);
      const size_t score = k.name == name ? section_distance
                                          : 1000 + section_distance + edit_distance(name, k.name);
      if (score < best_score) best = k.dotted(), best_score = score;
    }
  }
  return best;
}

std::string closest_section(const std::string& name) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& s : config_table()) {
    size_t d = edit_distance(name, s.name);
    if (d < best_distance) best = s.name, best_distance = d;
  }
  return best;
}

std::string unknown_key_message(const std::string& section, const std::string& name) {
  return "unknown config key '" + section + "." + name + "' (did you mean '" +
         closest_key(section, name) + "'?); --help lists every key";
}

std::string origin_of(const KeySpec& spec, const std::string& where) {
  return spec.kind == KeyKind::kAlias ? where + " as " + spec.dotted() : where;
}

std::string stored_key(const KeySpec& spec) {
  return spec.kind == KeyKind::kAlias ? spec.alias_of : spec.dotted();
}

void note_alias(JobConfig& cfg, const KeySpec& spec, const std::string& where) {
  if (spec.kind != KeyKind::kAlias) return;
  cfg.notes.push_back(spec.dotted() + " (torchtitan " + spec.versions + ") is titan's " +
                      spec.alias_of + (spec.alias_negates ? " negated" : "") + " (" + where + ")");
}

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream parts(text);
  for (std::string item; std::getline(parts, item, ',');) {
    if (!trim(item).empty()) items.push_back(trim(item));
  }
  return items;
}

}  // namespace detail

namespace {

// ---- command-line layer ----

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_bool_word(const std::string& s) {
  static const char* kWords[] = {"true", "false", "yes", "no", "on", "off", "1", "0"};
  const std::string l = lower(s);
  return std::any_of(std::begin(kWords), std::end(kWords), [&](const char* w) { return l == w; });
}

// The key an argument `--section.key[=v]` or `--section.no_key[=v]` names, or null. Sections may
// contain dots (`--quantize.linear.float8.recipe_name`): the key is the last component.
const KeySpec* key_of_arg(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return nullptr;
  const size_t eq = arg.find('=');
  const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  const std::string sec = name.substr(0, dot), key = name.substr(dot + 1);
  if (const KeySpec* spec = find_key(sec, key)) return spec;
  if (key.rfind("no_", 0) == 0) {
    const KeySpec* spec = find_key(sec, key.substr(3));
    if (spec != nullptr && spec->type == ValueType::kBool) return spec;
  }
  return nullptr;
}

struct Prepared {
  std::vector<std::string> args;  // rewritten for CLI11
  bool help = false;
};

// CLI11 needs help with three spellings: a flag's value after a space (`--x.y false`), an empty
// value after '=' (`--x.y=`), and a missing value, which it would fill with the next option.
Prepared prepare_args(const std::vector<std::string>& in, Problems& problems) {
  Prepared out;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string& arg = in[i];
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    const KeySpec* spec = key_of_arg(arg);
    const bool has_eq = arg.find('=') != std::string::npos;
    if (spec == nullptr) {
      out.args.push_back(arg);
    } else if (spec->type == ValueType::kBool) {
      if (has_eq && arg.back() == '=') {  // CLI11 would read `--x.y=` as `--x.y`
        problems.add(kCommandLine, arg + " has an empty value; write " + arg + "true or " + arg +
                                       "false, or leave out the '='");
        continue;
      }
      if (!has_eq && i + 1 < in.size() && is_bool_word(in[i + 1])) {
        out.args.push_back(arg + "=" + in[++i]);
      } else {
        out.args.push_back(arg);
      }
    } else if (has_eq) {
      const size_t eq = arg.find('=');
      out.args.push_back(arg.substr(0, eq));
      out.args.push_back(arg.substr(eq + 1));
    } else {
      if (i + 1 >= in.size() || in[i + 1].rfind("--", 0) == 0) {
        problems.add(kCommandLine, arg + " needs a value (" + type_phrase(spec->type) +
                                       "), e.g. " + arg + " VALUE or " + arg + "=VALUE");
        continue;
      }
      out.args.push_back(arg);
      out.args.push_back(in[++i]);
    }
  }
  return out;
}

std::string extra_arg_problem(const std::string& arg) {
  if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
    const std::string name = arg.substr(2, arg.find('=') - 2);
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) {
      return "unknown option '" + arg + "': overrides are --section.key VALUE (did you mean '--" +
             closest_key("", name) + "'?)";
    }
    const std::string sec = name.substr(0, dot), key = name.substr(dot + 1);
    if (find_section(sec) == nullptr) {
      return "unknown config section '" + sec + "' in '" + arg + "' (did you mean '" +
             closest_key(sec, key) + "'?); --help lists every key";
    }
    return unknown_key_message(sec, key);
  }
  return "unexpected argument '" + arg + "': overrides are --section.key VALUE; booleans take "
         "no value or =true/=false";
}

// Returns "" on success, else why `text` is not a T.
template <class T>
std::string parse_number(std::string text, T& out) {
  text = trim(text);
  if (!text.empty() && text[0] == '+') text.erase(0, 1);  // from_chars rejects a leading '+'
  const char* end = text.data() + text.size();
  auto res = std::from_chars(text.data(), end, out);
  if (text.empty() || res.ptr != end || res.ec == std::errc::invalid_argument) return "bad";
  if (res.ec == std::errc::result_out_of_range) return " (out of the representable range)";
  return "";
}

bool apply_cli_value(ParseState& st, const KeySpec& spec, const std::string& text) {
  ValueRef ref = spec.get(st.cfg);
  auto bad = [&](const std::string& why = "") {
    st.problems.add(kCommandLine, "--" + spec.dotted() + " expects " + type_phrase(spec.type) +
                                      ", got '" + text + "'" + (why == "bad" ? "" : why));
    return false;
  };
  switch (spec.type) {
    case ValueType::kBool: {
      // CLI11 passes `--x=yes` through as typed but turns `--no_x=yes` into "false".
      const std::string l = lower(trim(text));
      if (!is_bool_word(l)) return bad();
      *std::get<bool*>(ref) = (l == "true" || l == "yes" || l == "on" || l == "1") !=
                              spec.alias_negates;
      break;
    }
    case ValueType::kInt: {
      int64_t v = 0;
      if (auto why = parse_number(text, v); !why.empty()) return bad(why);
      *std::get<int64_t*>(ref) = v;
      break;
    }
    case ValueType::kFloat: {
      double v = 0;
      if (auto why = parse_number(text, v); !why.empty()) return bad(why);
      *std::get<double*>(ref) = v;
      break;
    }
    case ValueType::kString:
      *std::get<std::string*>(ref) = text;
      break;
    case ValueType::kStringList:
      *std::get<std::vector<std::string>*>(ref) = split_list(text);
      break;
  }
  return true;
}

// ---- validation of the merged config ----

// torchtitan's names for titan values become titan's; values whose feature titan lacks are
// refused by name.
void normalize_value(ParseState& st, const KeySpec& spec, std::string& value,
                     const std::string& where) {
  for (const auto& [from, to] : spec.value_aliases) {
    if (value == from) {
      st.cfg.notes.push_back(spec.dotted() + " value '" + from + "' (torchtitan) is titan's '" +
                             to + "' (" + where + ")");
      value = to;
    }
  }
  for (const auto& [v, feature] : spec.unimplemented_values) {
    if (value == v) {
      st.problems.add(where, "titan does not implement " + feature + " yet: " + spec.dotted() +
                                 " = '" + value + "'");
    }
  }
}

void validate_key(ParseState& st, const KeySpec& spec, const std::string& where) {
  JobConfig& cfg = st.cfg;
  const std::string shown = spec.dotted() + " = " + format_value(spec, cfg);
  ValueRef ref = spec.get(cfg);
  if (spec.kind == KeyKind::kAccepted) {
    const ConfigValue& value = cfg.torchtitan_values.at(spec.dotted());
    const bool inert = spec.inert_values.empty() ||
                       std::find(spec.inert_values.begin(), spec.inert_values.end(), value) !=
                           spec.inert_values.end();
    if (!inert) {
      st.problems.add(where, "titan does not implement " + spec.missing_feature + " yet: " +
                                 shown + " (accepted only as " +
                                 format_config_value(spec.inert_values.front()) + ")" +
                                 (spec.advice.empty() ? "" : "; " + spec.advice));
    }
    return;
  }
  std::optional<double> number;
  if (auto* i = std::get_if<int64_t*>(&ref)) number = static_cast<double>(**i);
  if (auto* d = std::get_if<double*>(&ref)) {
    if (!std::isfinite(**d)) {
      st.problems.add(where, shown + " is not a finite number");
      return;
    }
    number = **d;
  }
  if (spec.range && number && !spec.range->contains(*number)) {
    st.problems.add(where, shown + " is out of range: must be " + spec.range->describe());
  }
  auto check_choice = [&](std::string& value, bool is_item) {
    const size_t before = st.problems.lines.size();
    normalize_value(st, spec, value, where);
    if (st.problems.lines.size() != before) return;
    if (spec.choices.empty() ||
        std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end()) {
      return;
    }
    std::string allowed, hint;
    for (const auto& c : spec.choices) {
      allowed += (allowed.empty() ? "" : ", ") + c;
      if (lower(c) == lower(value)) hint = " (did you mean '" + c + "'?)";
    }
    const std::string what = spec.dotted() + (is_item ? " item '" : " = '") + value + "'";
    st.problems.add(where, what + " is not allowed; choose from: " + allowed + hint);
  };
  if (auto* s = std::get_if<std::string*>(&ref); s && spec.non_empty && (*s)->empty()) {
    st.problems.add(where, spec.dotted() + " is empty; give a path (the default is " +
                               format_value(spec, JobConfig{}) + ")");
    return;
  }
  if (auto* s = std::get_if<std::string*>(&ref)) check_choice(**s, false);
  if (auto* list = std::get_if<std::vector<std::string>*>(&ref)) {
    for (auto& item : **list) check_choice(item, true);
  }
  if (!spec.ignored_reason.empty() && !equals_default(spec, cfg)) {
    cfg.warnings.push_back(spec.ignored_reason + " (" + shown + ", from " + where + ")");
  }
}

// torchtitan trains on the GPU in bfloat16 by default; titan does the same on a machine with a
// GPU, and keeps the CPU's float32 elsewhere, unless the config says otherwise.
void apply_machine_defaults(ParseState& st, const MachineFacts& machine) {
  TrainingSection& t = st.cfg.training;
  if (machine.cuda_available && st.origins.count("training.device") == 0) {
    t.device = "cuda";
    st.origins["training.device"] = "default (a GPU is visible)";
  }
  if (t.device == "cuda" && st.origins.count("training.mixed_precision_param") == 0) {
    t.mixed_precision_param = "bfloat16";
    st.origins["training.mixed_precision_param"] = "default (device cuda)";
  }
  // torchtitan v0.2 reads the tokenizer from hf_assets_path unless (deprecated) tokenizer_path
  // names one.
  ModelSection& m = st.cfg.model;
  if (!m.hf_assets_path.empty() && st.origins.count("model.tokenizer_path") == 0) {
    m.tokenizer_path = m.hf_assets_path;
    st.origins["model.tokenizer_path"] = "default (model.hf_assets_path)";
  }
}

[[noreturn]] void throw_problems(const Problems& problems) {
  std::string text;
  for (const auto& line : problems.lines) text += (text.empty() ? "" : "\n") + line;
  if (problems.lines.size() > 1) {
    text += "\n(" + std::to_string(problems.lines.size()) + " problems in this config)";
  }
  throw ConfigError(text);
}

}  // namespace

MachineFacts MachineFacts::detect() {
  MachineFacts facts;
  facts.cuda_available = at::hasCUDA();
  facts.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  return facts;
}

JobConfig parse_job_config(const std::vector<std::string>& args) {
  return parse_job_config(args, MachineFacts::detect());
}

JobConfig parse_job_config(const std::vector<std::string>& args, const MachineFacts& machine) {
  JobConfig cfg;
  ParseState st{cfg, {}, {}};
  const Prepared prepared = prepare_args(args, st.problems);
  if (prepared.help) {
    cfg.help_requested = true;
    return cfg;
  }

  // CLI11 only tokenizes; values are kept as text and converted below, so its errors and ours
  // read the same and name the key.
  CLI::App app{"titan"};
  app.set_help_flag();
  app.allow_extras();
  std::vector<std::pair<const KeySpec*, CLI::Option*>> options;
  for (const auto& section : config_table()) {
    for (const auto& spec : section.keys) {
      const std::string flag = "--" + spec.dotted();
      CLI::Option* opt =
          spec.type == ValueType::kBool
              ? app.add_flag(flag + ",!--" + spec.section + ".no_" + spec.name, spec.help)
              : app.add_option(flag, spec.help);
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
      options.emplace_back(&spec, opt);
    }
  }
  std::vector<std::string> reversed(prepared.args.rbegin(), prepared.args.rend());
  try {
    app.parse(reversed);  // CLI11 consumes a vector from the back
  } catch (const CLI::ParseError& e) {
    st.problems.add(kCommandLine, e.what());
    throw_problems(st.problems);
  }
  const std::vector<std::string> extras = app.remaining();
  for (size_t i = 0; i < extras.size(); ++i) {
    st.problems.add(kCommandLine, extra_arg_problem(extras[i]));
    // `--unknown.key VALUE`: the value belongs to the unknown key, not a problem of its own.
    const bool takes_next = extras[i].rfind("--", 0) == 0 && extras[i].find('=') == std::string::npos;
    if (takes_next && i + 1 < extras.size() && extras[i + 1].rfind("--", 0) != 0) ++i;
  }

  const KeySpec* config_file = find_key("job", "config_file");
  for (const auto& [spec, opt] : options) {
    if (spec == config_file && opt->count() > 0 &&
        apply_cli_value(st, *spec, opt->results().back())) {
      try {
        apply_toml_file(st, cfg.job.config_file);
      } catch (const ConfigError& e) {  // unreadable or not TOML: nothing of it can be checked
        st.problems.lines.push_back(e.what());
      } catch (const std::exception& e) {  // out of memory inside toml++, or anything else
        st.problems.lines.push_back("config file '" + cfg.job.config_file +
                                    "' could not be read: " + e.what());
      }
    }
  }
  for (const auto& [spec, opt] : options) {
    if (opt->count() == 0 || spec == config_file) continue;
    if (apply_cli_value(st, *spec, opt->results().back())) {  // the last occurrence wins
      st.origins[stored_key(*spec)] = origin_of(*spec, kCommandLine);
      note_alias(cfg, *spec, kCommandLine);
    }
  }
  apply_machine_defaults(st, machine);

  for (const auto& section : config_table()) {
    for (const auto& spec : section.keys) {
      if (spec.kind == KeyKind::kAlias) continue;  // validated as its target
      auto it = st.origins.find(spec.dotted());
      validate_key(st, spec, it == st.origins.end() ? "default" : it->second);
    }
  }
  for (const auto& [where, what] : check_key_relations(cfg, st.origins, machine)) st.problems.add(where, what);
  if (st.problems.lines.empty()) add_start_up_warnings(cfg);

  if (!st.problems.lines.empty()) throw_problems(st.problems);
  return cfg;
}

JobConfig parse_job_config(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_job_config(args);
}

}  // namespace titan::trainer::config
