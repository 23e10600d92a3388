// parallel/pipeline/orders.h — pipeline schedules as data: for every rank of the pp dimension,
// the ordered compute actions of one step (See Note [Schedules as data] in schedule.h).
//
// The generated orders are torch.distributed.pipelining's, action for action and idle slot for
// idle slot (torch 2.7 - 2.15 generate the same ones): GPipe and 1F1B (one stage per rank),
// Interleaved1F1B, LoopedBFS and InterleavedZeroBubble (several stages per rank, "loop"
// placement: rank r holds stages r, r + pp, r + 2 pp, ...) and ZBVZeroBubble (two stages per
// rank, "V" placement: rank r holds stages r and 2 pp - 1 - r). An idle slot is where a rank
// waits for a neighbour; the orders of all ranks advance in lock-step, one slot at a time, which
// is what makes every send meet its receive. A schedule may also come from a CSV file in
// torchtitan's format (pipeline_parallel_schedule_csv): one row per rank, one cell per slot,
// an empty cell idle.
//
// One difference from torch, on purpose: torch's 1F1B order numbers the last rank's forwards
// from 1 (F1 .. Fm, never F0; torch never runs that order, it is informational there). titan
// runs the order it generates, so its last rank forwards F0 .. F(m-1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace titan::parallel::pipeline {

enum class PipelineScheduleKind {
  kGPipe,
  k1F1B,
  kInterleaved1F1B,
  kLoopedBFS,
  kInterleavedZeroBubble,
  kZBVZeroBubble,
};

// Every schedule titan runs, in the order `--help` lists them.
const std::vector<PipelineScheduleKind>& pipeline_schedule_kinds();
const char* pipeline_schedule_name(PipelineScheduleKind kind);  // torchtitan's name, e.g. "Interleaved1F1B"
// As torch's get_schedule_class matches parallelism.pipeline_schedule: the whole name, compared
// without regard to case, no aliases. Throws std::invalid_argument naming the valid names; DualPipeV
// is refused with its reason (it pays off only when MoE all-to-all overlaps compute).
PipelineScheduleKind pipeline_schedule_from_name(const std::string& name);
bool is_single_stage(PipelineScheduleKind kind);   // GPipe, 1F1B: one stage per rank
bool uses_v_placement(PipelineScheduleKind kind);  // ZBVZeroBubble: stages r and 2 pp - 1 - r
// The stages per rank when the config does not say (layers_per_stage unset): 1 or 2, as torchtitan.
int default_stages_per_rank(PipelineScheduleKind kind);

// The stages rank `rank` holds, in the order it builds them: loop placement r, r + pp, ...; V
// placement r, 2 pp - 1 - r. Throws std::invalid_argument when num_stages is not a multiple of pp
// or a V schedule would hold other than two stages per rank.
std::vector<int> stages_of_rank(int rank, int pp, int num_stages, bool v_placement);

using RankActions = std::vector<std::optional<Action>>;  // one slot per step; empty = idle
using PipelineOrder = std::vector<RankActions>;          // one per pp rank, rank order

// torch's constraints on (schedule, pp, stages per rank, micro-batches), with torch's words:
// GPipe and 1F1B need at least as many micro-batches as stages; Interleaved1F1B and
// InterleavedZeroBubble a micro-batch count that is a multiple of the rounds max(1, m / pp);
// ZBVZeroBubble exactly two stages per rank; single-stage schedules one. Throws
// std::invalid_argument.
void check_pipeline_schedule(PipelineScheduleKind kind, int pp, int stages_per_rank, int64_t microbatches);
// The order every rank runs (check_pipeline_schedule first).
PipelineOrder pipeline_order(PipelineScheduleKind kind, int pp, int stages_per_rank, int64_t microbatches);

// Checks that an order is a complete schedule, as torch's _validate_schedule: pp ranks; every
// backward (B or I) after the forward of its stage and micro-batch, every W after its I; a stage on
// one rank only; per stage exactly `microbatches` forwards and backwards (B, or I and W in pairs).
// Also that no (stage, type, micro-batch) appears twice and every micro-batch is in [0, m), which
// torch does not check. Returns the rank of every stage; throws std::invalid_argument naming the
// rank, the step and the action.
std::vector<int> validate_pipeline_order(const PipelineOrder& order, int pp, int num_stages, int64_t microbatches);

// A CSV schedule (torchtitan's pipeline_parallel_schedule_csv): row r is rank r's slots; cells are
// actions ("0F1", "2I0", "2W0") or empty (idle); spaces around a cell are ignored. `origin` names
// the file in errors. Communication actions (SEND_F, RECV_B, ...) are refused: titan derives the
// transfers from the compute order. Throws std::invalid_argument naming origin, row and column.
PipelineOrder parse_pipeline_csv(const std::string& text, const std::string& origin);
PipelineOrder read_pipeline_csv(const std::string& path);  // a regular file of at most 64 MiB
std::string pipeline_order_csv(const PipelineOrder& order);
// torch's _format_pipeline_order table: one row per step, one column per rank.
std::string format_pipeline_order(const PipelineOrder& order);

}  // namespace titan::parallel::pipeline
