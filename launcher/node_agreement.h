// launcher/node_agreement.h — how the titan-runs of a multi-node job agree on every restart
// (Note [Restarts across nodes] in node_agreement.cpp). Used only with --nnodes > 1 and
// --max-restarts > 0: without restarts there is nothing to agree on, and each node's titan-run
// runs alone as before.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "launcher/launcher.h"
#include "launcher/supervisor.h"

namespace titan::launcher {

// The job cannot go on (a node did not join or rejoin in time, a node's titan-run is gone, a
// node was refused): titan-run prints the message and exits with `exit_code`.
class JobEnded : public std::runtime_error {
 public:
  JobEnded(int exit_code, const std::string& message) : std::runtime_error(message), exit_code(exit_code) {}
  int exit_code;
};

class NodeAgreement {
 public:
  // Node 0 listens on options.master_port; every other node connects to it there, retrying until
  // options.join_timeout_seconds. Returns once the connection stands (node 0: at once).
  explicit NodeAgreement(const LaunchOptions& options);
  ~NodeAgreement();
  NodeAgreement(const NodeAgreement&) = delete;
  NodeAgreement& operator=(const NodeAgreement&) = delete;

  // Before attempt `attempt`: node 0 waits until every node is ready (joined, or reported the
  // last attempt's end), picks a free port for the trainers' store and sends it to all; the
  // others wait for it. Returns that port. Throws JobEnded.
  int begin_attempt(int attempt);

  // While the attempt runs: the connections to poll beside the ranks' output, and what they
  // say (a reason to stop every local rank now because another node failed, or nothing).
  AttemptWatch watch();

  // After the attempt ended on this node with `local`: every node's result is gathered on node 0
  // (after telling the nodes still running to stop, if this attempt failed anywhere), merged into
  // the job's result (the earliest failure; the last step logged anywhere) and sent back, so that
  // every node decides the same thing from the same facts. Throws JobEnded.
  AttemptResult end_attempt(int attempt, const AttemptResult& local);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace titan::launcher
