// TensorBoard event files (trainer/observe/tensorboard.h), read back by TensorBoard's own loader (the
// `tensorboard` package that scripts/setup.sh installs into .deps/venv).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "trainer/observe/tensorboard.h"

using namespace titan::trainer::observe;
namespace fs = std::filesystem;

namespace {

std::string run_and_capture(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  INFO(out);
  REQUIRE(status == 0);
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value", "[tensorboard]") {
  CHECK(crc32c("123456789") == 0xE3069283u);  // the standard CRC-32C check value
  CHECK(crc32c("") == 0u);
}

TEST_CASE("TensorBoard reads titan's event files", "[tensorboard]") {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  const std::string python = std::string(src) + "/.deps/venv/bin/python";
  const fs::path dir = titan::testing::fresh_temp_dir("tensorboard");
  const std::map<std::string, double> per_step = {{"loss", 2.5},   {"grad_norm", 1.25},
                                                  {"lr", 8e-4},    {"memory/max_reserved_gib", 0.13},
                                                  {"tps", 951.0},  {"mfu", 49.39}};
  {
    TensorBoardWriter writer((dir / "run").string());
    for (int64_t step : {1, 10, 20}) {
      for (const auto& [tag, value] : per_step) writer.add_scalar(tag, value * step, step);
    }
  }
  const std::string script =
      "import json, sys\n"
      "from tensorboard.backend.event_processing import event_accumulator as ea\n"
      "acc = ea.EventAccumulator(sys.argv[1]); acc.Reload()\n"
      "print(json.dumps({t: [[s.step, s.value] for s in acc.Scalars(t)] "
      "for t in acc.Tags()['scalars']}))\n";
  const fs::path script_path = dir / "read_events.py";
  std::ofstream(script_path) << script;
  const std::string out = run_and_capture(python + " " + script_path.string() + " " +
                                          (dir / "run").string() + " 2>/dev/null");
  const nlohmann::json scalars = nlohmann::json::parse(out.substr(out.find('{')));
  REQUIRE(scalars.size() == per_step.size());
  for (const auto& [tag, value] : per_step) {
    INFO(tag);
    REQUIRE(scalars.contains(tag));
    const auto& points = scalars[tag];
    REQUIRE(points.size() == 3);
    int i = 0;
    for (int64_t step : {1, 10, 20}) {
      CHECK(points[i][0].get<int64_t>() == step);
      // simple_value is a float32: equal to the value rounded to float.
      CHECK(points[i][1].get<double>() == static_cast<double>(static_cast<float>(value * step)));
      ++i;
    }
  }
  fs::remove_all(dir);
}
