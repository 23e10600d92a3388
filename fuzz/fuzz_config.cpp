// libFuzzer target: a TOML config file -> the validated JobConfig (trainer/config/job_config.h). Every input
// must either parse into a config whose TOML re-parses to the same TOML, or throw ConfigError
// (the one error a user sees for a bad config, exit code 2).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_input_file.h"
#include "trainer/config/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::trainer::config;
  const std::string& path = titan::fuzz::write_input("config", data, size);
  const MachineFacts machine{};  // a CPU machine: the result does not depend on this host
  std::string toml;
  try {
    toml = config_to_toml(parse_job_config({"--job.config_file", path}, machine));
  } catch (const ConfigError&) {
    return 0;
  }
  // The printed config is itself a config file (--job.print_args): it must parse back unchanged.
  const std::string& again = titan::fuzz::write_input("config", reinterpret_cast<const uint8_t*>(toml.data()), toml.size());
  try {
    if (config_to_toml(parse_job_config({"--job.config_file", again}, machine)) != toml) std::abort();
  } catch (const ConfigError&) {
    std::abort();
  }
  return 0;
}
