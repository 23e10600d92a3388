#include "util/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

namespace titan::util {
namespace {

std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> instance;
  return instance;
}
bool g_color = false;

std::shared_ptr<spdlog::logger>& ensure_logger() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!logger()) init_logging(-1, true);
  });
  return logger();
}

}  // namespace

void init_logging(int rank, bool disable_color) {
  g_color = !disable_color && isatty(STDOUT_FILENO);
  auto sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>(
      g_color ? spdlog::color_mode::always : spdlog::color_mode::never);
  auto log = std::make_shared<spdlog::logger>("titan", sink);
  std::string prefix = rank >= 0 ? "[rank" + std::to_string(rank) + "] " : "";
  // torchtitan's look: "[titan] 2026-01-01 12:00:00,123 - INFO - message"
  log->set_pattern(prefix + "[titan] %Y-%m-%d %H:%M:%S,%e - %^%l%$ - %v");
  log->set_level(spdlog::level::info);
  log->flush_on(spdlog::level::info);
  logger() = log;
}

void log_info(const std::string& message) { ensure_logger()->info(message); }
void log_warn(const std::string& message) { ensure_logger()->warn(message); }
void log_error(const std::string& message) { ensure_logger()->error(message); }

const char* color_code(const char* name) {
  if (!g_color) return "";
  if (!std::strcmp(name, "green")) return "\033[32m";
  if (!std::strcmp(name, "yellow")) return "\033[33m";
  if (!std::strcmp(name, "blue")) return "\033[34m";
  if (!std::strcmp(name, "cyan")) return "\033[36m";
  if (!std::strcmp(name, "red")) return "\033[31m";
  if (!std::strcmp(name, "reset")) return "\033[39m";
  return "";
}

}  // namespace titan::util
