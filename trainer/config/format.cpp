// trainer/config/format.cpp — config values as text: the printed TOML and the --help text.
// Both walk the key table, so a new key shows up in them without touching this file.
#include <charconv>
#include <cstdio>
#include <sstream>

#include "trainer/config/key_table.h"

namespace titan::trainer::config {

namespace detail {

const char* type_name(ValueType type) {
  switch (type) {
    case ValueType::kBool: return "bool";
    case ValueType::kInt: return "int";
    case ValueType::kFloat: return "float";
    case ValueType::kString: return "string";
    case ValueType::kStringList: return "list";
  }
  return "?";
}

const char* type_phrase(ValueType type) {
  switch (type) {
    case ValueType::kBool: return "a boolean (true or false)";
    case ValueType::kInt: return "an integer";
    case ValueType::kFloat: return "a number";
    case ValueType::kString: return "a string";
    case ValueType::kStringList: return "a list of strings (TOML [\"a\", \"b\"]; command line a,b)";
  }
  return "?";
}

std::string format_float(double v) {
  // Shortest digits that read back as the same double, so print_args round-trips exactly.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  // A TOML float needs a '.' or an exponent; "2" would read back as an integer.
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  // to_chars writes "8e-04"; TOML takes it, but people write 8e-4.
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    size_t digits = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  }
  return s;
}

std::string quote_toml(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04X", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

namespace {
struct Visitor {
  std::string operator()(bool* v) const { return *v ? "true" : "false"; }
  std::string operator()(int64_t* v) const { return std::to_string(*v); }
  std::string operator()(double* v) const { return format_float(*v); }
  std::string operator()(std::string* v) const { return quote_toml(*v); }
  std::string operator()(std::vector<std::string>* v) const {
    std::string out = "[";
    for (size_t i = 0; i < v->size(); ++i) out += (i ? ", " : "") + quote_toml((*v)[i]);
    return out + "]";
  }
};
}  // namespace

std::string format_value(const KeySpec& spec, const JobConfig& cfg) {
  return std::visit(Visitor{}, spec.get(cfg));
}

std::string format_config_value(const ConfigValue& value) {
  ConfigValue copy = value;
  return std::visit([](auto& v) { return Visitor{}(&v); }, copy);
}

bool equals_default(const KeySpec& spec, const JobConfig& cfg) {
  // Not const: an accepted key's slot is created on first use (JobConfig::torchtitan_values).
  static JobConfig defaults{};
  return std::visit(
      [&](auto* value) {
        using Ptr = decltype(value);
        return *value == *std::get<Ptr>(spec.get(defaults));
      },
      spec.get(cfg));
}

}  // namespace detail

using namespace detail;

// Titan's keys are printed with their values; an alias is printed as its target; a torchtitan
// key titan accepts without an effect only when it differs from torchtitan's default (with the
// reason), so that the printed file re-parses to the same config and stays readable.
std::string config_to_toml(const JobConfig& cfg) {
  std::ostringstream os;
  os << "# titan effective job config; run it again with --job.config_file <this file>.\n";
  for (const auto& section : config_table()) {
    std::ostringstream body;
    for (const auto& spec : section.keys) {
      if (spec.kind == KeyKind::kAlias) continue;
      if (spec.kind == KeyKind::kAccepted) {
        auto it = cfg.torchtitan_values.find(spec.dotted());
        if (it == cfg.torchtitan_values.end() || it->second == *spec.default_value) continue;
      }
      body << "# " << spec.help << "\n";
      // A config file may not name another config file, so this one stays a comment.
      if (spec.cli_only) body << "# (command line only) ";
      body << spec.name << " = " << format_value(spec, cfg) << "\n";
    }
    if (body.str().empty()) continue;
    os << "\n[" << section.name << "]  # " << section.help << "\n" << body.str();
  }
  return os.str();
}

std::vector<std::pair<std::string, std::string>> config_entries_for_agreement(const JobConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& section : config_table()) {
    for (const auto& spec : section.keys) {
      if (spec.kind == KeyKind::kAlias) continue;  // compared as its target
      // Per-rank by nature: the file's path may differ between nodes (its values are compared
      // key by key), and printing the config is a local choice.
      if (spec.dotted() == "job.config_file" || spec.dotted() == "job.print_args") continue;
      if (spec.kind == KeyKind::kAccepted) {
        auto it = cfg.torchtitan_values.find(spec.dotted());
        entries.emplace_back(spec.dotted(), it == cfg.torchtitan_values.end()
                                                ? format_config_value(*spec.default_value)
                                                : format_config_value(it->second));
        continue;
      }
      entries.emplace_back(spec.dotted(), format_value(spec, cfg));
    }
  }
  return entries;
}

namespace {

// Word-wraps `text` to `width` columns, every line starting with `indent`.
std::string wrap(const std::string& text, const std::string& indent, size_t width) {
  std::istringstream words(text);
  std::string word, line, out;
  while (words >> word) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

}  // namespace

namespace {

// The help of one section: each key with its type, default, range, choices and meaning.
void section_help(std::ostream& os, const SectionSpec& section) {
  static JobConfig defaults{};  // not const: see equals_default
  os << "\n[" << section.name << "]  " << section.help << "\n";
  for (const auto& spec : section.keys) {
    if (spec.kind == KeyKind::kAlias) {
      os << "  --" << spec.dotted() << "  = --" << spec.alias_of << (spec.alias_negates ? " negated" : "")
         << " (torchtitan " << spec.versions << ")\n";
      continue;
    }
    if (spec.kind == KeyKind::kAccepted) {
      os << "  --" << spec.dotted() << "  (torchtitan" << (spec.versions.empty() ? "" : " " + spec.versions)
         << ", default " << format_config_value(*spec.default_value) << ")\n"
         << wrap(spec.help, "      ", 96);
      continue;
    }
    std::string flag = "--" + spec.dotted();
    if (spec.type == ValueType::kBool) {
      flag += ", --" + spec.section + ".no_" + spec.name;
    } else {
      flag += std::string(" ") + (spec.type == ValueType::kStringList ? "A,B,..." : "") +
              (spec.type == ValueType::kInt ? "INT" : "") + (spec.type == ValueType::kFloat ? "FLOAT" : "") +
              (spec.type == ValueType::kString ? "STRING" : "");
    }
    // The metavar already names the type of non-boolean keys.
    std::string facts = (spec.type == ValueType::kBool ? "bool, default " : "default ") + format_value(spec, defaults);
    if (spec.range) facts += "; " + spec.range->describe();
    if (!spec.choices.empty()) {
      facts += std::string(spec.type == ValueType::kStringList ? "; each of: " : "; one of: ") +
               join(spec.choices, ", ");
    }
    if (spec.cli_only) facts += "; command line only";
    if (!spec.ignored_reason.empty()) facts += "; accepted but ignored";
    os << "  " << flag << "  (" << facts << ")\n" << wrap(spec.help, "      ", 96);
  }
}

}  // namespace

std::string config_help_of(const std::string& section_name) {
  std::ostringstream os;
  for (const auto& section : config_table())
    if (section.name == section_name) section_help(os, section);
  return os.str();
}

std::string config_help() {
  std::ostringstream os;
  os << "Usage: titan [--job.config_file FILE.toml] [--section.key VALUE ...]\n\n"
        "Each value comes from, later winning: the defaults below < the TOML file named by\n"
        "--job.config_file (torchtitan's sections and keys) < command-line overrides.\n"
        "  --section.key VALUE  or  --section.key=VALUE\n"
        "  booleans: --section.key turns it on; --section.no_key, --section.key=false or\n"
        "            --section.key false turn it off\n"
        "  lists:    --section.key a,b,c\n"
        "  -h, --help prints this; --job.print_args prints the effective config as TOML.\n";
  for (const auto& section : config_table()) section_help(os, section);
  return os.str();
}

}  // namespace titan::trainer::config
