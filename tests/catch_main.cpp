// The one Catch2 (v2) main shared by every test executable, with two additions for ctest:
//
//  * `--list-tests-for-ctest` prints one line per test case, "<name>\t<tags>" (tags as written,
//    e.g. "[parallel][dist]"); tests/catch_discover.cmake registers each case as its own ctest
//    entry, labelled from its tags.
//  * Note [Skipped, never passed]: a [cuda] case needs a CUDA device. Catch2 v2 has no SKIP, so
//    without a device a run that selects only [cuda] cases prints why and exits with
//    kSkipReturnCode, which ctest's SKIP_RETURN_CODE reports as "Skipped"; a run that selects
//    other cases as well leaves the [cuda] ones out and says how many it left out.
//  * Note [One scratch folder per test process]: a run works under its own <tmp>/titan-test-<pid>,
//    set as TMPDIR before any case starts, so whatever a case, or a rank it launches, writes
//    under temp_directory_path() lands there. When every case passed the folder is removed; after
//    a failure only checkpoint shards (*.safetensors, the bulk) go and the path is printed, so
//    logs and metrics stay for diagnosis. CI shares its disk: a suite that kept its checkpoints
//    (about 14 GB over a day's runs) once filled it, and the next run's checkpoints failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tests/cuda_probe.h"

namespace titan::testing {
bool (*cuda_device_probe)() = nullptr;
}  // namespace titan::testing

namespace {

constexpr int kSkipReturnCode = 77;  // tests/CMakeLists.txt sets SKIP_RETURN_CODE to this

bool has_tag(const Catch::TestCase& test, const std::string& lowercase_tag) {
  const auto& tags = test.getTestCaseInfo().lcaseTags;
  return std::find(tags.begin(), tags.end(), lowercase_tag) != tags.end();
}

std::string tags_of(const Catch::TestCase& test) {
  std::string joined;
  for (const auto& tag : test.getTestCaseInfo().tags) joined += "[" + tag + "]";
  return joined;
}

// Note [One scratch folder per test process].
class ScratchRoot {
 public:
  ScratchRoot() : dir_(std::filesystem::temp_directory_path() / ("titan-test-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  void finish(bool passed) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (passed) {
      fs::remove_all(dir_, ec);
      return;
    }
    for (auto it = fs::recursive_directory_iterator(dir_, ec); it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->path().extension() == ".safetensors") fs::remove(it->path(), ec);
    if (fs::is_empty(dir_, ec)) {
      fs::remove(dir_, ec);  // nothing was written: nothing to keep
      return;
    }
    std::cout << "the failed run's logs are kept in " << dir_.string() << " (checkpoint shards removed)\n";
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace

int main(int argc, char* argv[]) {
  std::vector<char*> args(argv, argv + argc);
  bool list_for_ctest = false;
  args.erase(std::remove_if(args.begin(), args.end(),
                            [&](char* a) {
                              const bool ours = std::string(a) == "--list-tests-for-ctest";
                              list_for_ctest |= ours;
                              return ours;
                            }),
             args.end());

  Catch::Session session;
  if (const int rc = session.applyCommandLine(static_cast<int>(args.size()), args.data())) return rc;
  const auto& all = Catch::getAllTestCasesSorted(session.config());

  if (list_for_ctest) {
    for (const auto& test : all)
      if (!test.isHidden()) std::cout << test.getTestCaseInfo().name << '\t' << tags_of(test) << '\n';
    return 0;
  }

  const bool cuda = titan::testing::cuda_device_probe && titan::testing::cuda_device_probe();
  if (!cuda && !session.config().listTestNamesOnly() && !session.config().listTests()) {
    const auto selected = Catch::filterTests(all, session.config().testSpec(), session.config());
    const auto needs_cuda = std::count_if(selected.begin(), selected.end(),
                                          [](const Catch::TestCase& t) { return has_tag(t, "cuda"); });
    if (needs_cuda > 0 && needs_cuda == static_cast<long>(selected.size())) {
      std::cout << "SKIPPED: " << needs_cuda
                << " [cuda] test case(s) need a CUDA device (none here, or a CPU-only build)\n";
      return kSkipReturnCode;
    }
    if (needs_cuda > 0) {
      // Mixed selection: run the others. Separate spec arguments are ANDed (commas are ORs), so
      // one more "~[cuda]" argument excludes the [cuda] cases from any comma-free spec.
      Catch::ConfigData data = session.configData();
      const bool has_or = std::any_of(data.testsOrTags.begin(), data.testsOrTags.end(),
                                      [](const std::string& s) { return s.find(',') != std::string::npos; });
      if (has_or) {
        std::cout << "WARNING: no CUDA device, and the test spec has ',': its " << needs_cuda
                  << " [cuda] case(s) run but check nothing; select them separately\n";
      } else {
        data.testsOrTags.push_back("~[cuda]");
        session.useConfigData(data);
        std::cout << "NOTE: " << needs_cuda << " [cuda] test case(s) skipped: no CUDA device\n";
      }
    }
  }
  // A listing runs no case (and its return value is the count listed, not failures).
  const auto& config = session.config();
  if (config.listTests() || config.listTestNamesOnly() || config.listTags() || config.listReporters())
    return session.run();
  const ScratchRoot scratch;
  const int failed = session.run();
  scratch.finish(failed == 0);
  return failed;
}
