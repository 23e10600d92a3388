// trainer/config/agreement.h — every rank must run the same job.
//
// Ranks started with different configs either abort inside a collective whose sizes disagree
// (another flavor: Gloo's "Received data size doesn't match expected size") or, worse, train
// without a word (a different seq_len, lr, seed or float8 recipe on one rank). So right after
// the process group forms, before any model-dependent collective, every rank all-gathers a
// 64-bit hash of its effective config (config_entries_for_agreement: every resolved key = value
// except job.config_file and job.print_args, plus the build's identity). Equal hashes: nothing
// more is sent. Any difference: a second all-gather of one hash per key finds the first key
// that differs, a third gathers that key's value from every rank, and every rank refuses to
// start with the same message, e.g.
//   config differs across ranks: training.seq_len is 2048 on ranks 0,2,3 but 1024 on rank 1
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "trainer/config/job_config.h"

namespace titan::trainer::config {

// The entries compared: "titan.build" (this build's source commit) first, then the config's.
std::vector<std::pair<std::string, std::string>> agreement_entries(const JobConfig& cfg);

// Collective over `world` (tensors on `device`, the backend's device). Throws ConfigError on
// every rank when the ranks' entries differ, naming the first differing key, its values and
// the ranks holding each.
void check_config_agreement(parallel::comm::Comm& world, const JobConfig& cfg, const c10::Device& device);

// The message for `values[r]` = the value rank r holds for `key` (exposed for tests).
std::string describe_disagreement(const std::string& key, const std::vector<std::string>& values,
                                  int other_keys_differing);

}  // namespace titan::trainer::config
