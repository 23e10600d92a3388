// util/logging.h — titan's log: spdlog underneath, rank-aware, colors only on a terminal.
//
// This header deliberately exposes plain strings only. spdlog (Debian, fmt 9) and the fmt 12
// headers shipped inside the torch wheel cannot meet in one translation unit, so spdlog is
// confined to logging.cpp; callers build messages with c10::str(...) or std::ostringstream.
#pragma once

#include <string>

namespace titan::util {

// Call once per process, before the first message. `rank` < 0 means "not distributed"
// (no rank prefix). Colors are used only when stdout is a terminal and `disable_color` is false.
void init_logging(int rank, bool disable_color);

void log_info(const std::string& message);
void log_warn(const std::string& message);
void log_error(const std::string& message);

// ANSI color helpers for the per-step metrics line; return "" when colors are off.
const char* color_code(const char* name);  // "green", "yellow", "blue", "cyan", "red", "reset"

}  // namespace titan::util
