// trainer/config_keys.cpp — THE table of config keys: the only place a key is declared.
//
// To add a key: add the field (with its default as the initializer) to its section struct in
// config.h, then one row here. Parsing, type checks, range/choice checks, --help and
// --job.print_args all follow from the row. Key names follow torchtitan where it has them.
#include <cmath>
#include <sstream>

#include "trainer/config_table.h"

namespace titan::trainer::config_detail {

namespace {

std::vector<SectionSpec> build_table() {
  using J = JobConfig;
  return {
      section("job", &J::job, "Job identity and outputs.", {
          key("config_file", &JobSection::config_file,
              "TOML file to read; it overrides the defaults and the command line overrides it.")
              .command_line_only(),
          key("dump_folder", &JobSection::dump_folder, "Folder for the job's outputs."),
          key("description", &JobSection::description, "Free-text description of the run."),
          key("print_args", &JobSection::print_args,
              "Print the effective config as TOML at start-up."),
      }),
      section("profiling", &J::profiling, "Profiler traces and memory snapshots.", {}),
      section("metrics", &J::metrics, "The per-step metrics log line.", {
          key("log_freq", &MetricsSection::log_freq,
              "Log metrics at step 1 and every this many steps.").at_least(1),
          key("disable_color_printing", &MetricsSection::disable_color_printing,
              "No ANSI colors in the log (they are only used on a terminal anyway)."),
          key("peak_flops", &MetricsSection::peak_flops,
              "Peak FLOP/s that MFU divides by; 0 = measure it with a GEMM probe at start-up "
              "(CPU) or use the known peak of the GPU.").at_least(0),
      }),
      section("model", &J::model, "Which model to build and how to tokenize.", {
          key("name", &ModelSection::name, "Model family.").one_of({"llama3"}),
          key("flavor", &ModelSection::flavor, "Model size (debugmodel is CPU-sized).")
              .one_of({"debugmodel", "8B", "70B", "405B"}),
          key("tokenizer_path", &ModelSection::tokenizer_path,
              "\"\" = byte-level tokenizer; else a tiktoken-format BPE file (Llama 3's "
              "tokenizer.model)."),
          key("converters", &ModelSection::converters,
              "Model rewrites applied after the model is built, in order.").one_of({"float8"}),
      }),
      section("optimizer", &J::optimizer, "Optimizer and its hyper-parameters.", {
          key("name", &OptimizerSection::name,
              "AdamW = decoupled weight decay; Adam = weight decay added to the gradient.")
              .one_of({"AdamW", "Adam"}),
          key("lr", &OptimizerSection::lr, "Peak learning rate, reached at the end of warmup.")
              .above(0),
          key("eps", &OptimizerSection::eps, "Added to Adam's denominator.").above(0),
          key("beta1", &OptimizerSection::beta1, "Adam first-moment decay.").in_half_open(0, 1),
          key("beta2", &OptimizerSection::beta2, "Adam second-moment decay.").in_half_open(0, 1),
          key("weight_decay", &OptimizerSection::weight_decay, "Weight decay coefficient.")
              .at_least(0),
      }),
      section("lr_scheduler", &J::lr_scheduler, "Learning-rate warmup, plateau and decay.", {
          key("warmup_steps", &LrSchedulerSection::warmup_steps,
              "Steps of linear warmup up to optimizer.lr.").at_least(0),
          key("decay_ratio", &LrSchedulerSection::decay_ratio,
              "Fraction of training.steps spent decaying at the end (warmup-stable-decay); "
              "-1 = decay over all steps after warmup.").in_closed(0, 1).or_exactly(-1),
          key("decay_type", &LrSchedulerSection::decay_type, "Shape of the decay.")
              .one_of({"linear", "sqrt", "cosine"}),
          key("min_lr_factor", &LrSchedulerSection::min_lr_factor,
              "Final learning rate as a fraction of optimizer.lr.").in_closed(0, 1),
      }),
      section("training", &J::training, "Data, batch shape, loop length and numerics.", {
          key("dataset", &TrainingSection::dataset, "Dataset to train on.")
              .one_of({"fortunes", "text", "jsonl", "tokens"}),
          key("dataset_path", &TrainingSection::dataset_path,
              "Where the dataset lives; \"\" = the dataset's default location."),
          key("local_batch_size", &TrainingSection::local_batch_size,
              "Sequences per device per micro-batch.").at_least(1),
          key("global_batch_size", &TrainingSection::global_batch_size,
              "Sequences per optimizer step over all data-parallel ranks; -1 = local_batch_size "
              "x data-parallel degree; a multiple of that accumulates gradients.")
              .at_least(1).or_exactly(-1),
          key("seq_len", &TrainingSection::seq_len, "Tokens per sequence.").at_least(1),
          key("max_norm", &TrainingSection::max_norm,
              "Clip the global gradient L2 norm to this; must be > 0 (clipping is always on, "
              "a huge value makes it a no-op).").above(0),
          key("steps", &TrainingSection::steps, "Optimizer steps to run.").at_least(1),
          key("mixed_precision_param", &TrainingSection::mixed_precision_param,
              "dtype parameters are computed in (master weights stay float32).")
              .one_of({"bfloat16", "float32"}),
          key("mixed_precision_reduce", &TrainingSection::mixed_precision_reduce,
              "dtype of data-parallel gradient reduction.").one_of({"float32"}),
          key("compile", &TrainingSection::compile,
              "torchtitan's torch.compile switch; accepted, has no effect in titan.")
              .ignored("training.compile is accepted but ignored: titan has no JIT, its "
                       "kernels are compiled ahead of time"),
          key("seed", &TrainingSection::seed, "Random seed for weight init and data order."),
          key("deterministic", &TrainingSection::deterministic,
              "Use deterministic algorithms (slower; reruns are bit-identical)."),
          key("device", &TrainingSection::device, "Where to train.").one_of({"cpu", "cuda"}),
          key("num_threads", &TrainingSection::num_threads,
              "Intra-op CPU threads; 0 = all cores.").at_least(0),
      }),
      section("parallelism", &J::parallelism, "Data/tensor/pipeline-parallel layout.", {}),
      section("checkpoint", &J::checkpoint, "Initial weights and exported weights.", {
          key("initial_load_path", &CheckpointSection::initial_load_path,
              "safetensors file to start from; \"\" = random init."),
          key("export_path", &CheckpointSection::export_path,
              "Write the final weights as safetensors here; \"\" = don't export."),
          key("export_dtype", &CheckpointSection::export_dtype, "dtype of exported weights.")
              .one_of({"float32", "bfloat16"}),
      }),
      section("activation_checkpoint", &J::activation_checkpoint,
              "Recomputing activations in backward to save memory.", {}),
      section("float8", &J::float8, "float8 training.", {}),
      section("comm", &J::comm, "Collective timeouts and tracing.", {}),
  };
}

}  // namespace

const std::vector<SectionSpec>& config_table() {
  static const std::vector<SectionSpec> table = build_table();
  return table;
}

const SectionSpec* find_section(const std::string& name) {
  for (const auto& s : config_table()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const KeySpec* find_key(const std::string& section, const std::string& name) {
  const SectionSpec* s = find_section(section);
  if (s == nullptr) return nullptr;
  for (const auto& k : s->keys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

bool Range::contains(double v) const {
  if (sentinel && v == *sentinel) return true;
  if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
  if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
  return true;
}

std::string Range::describe() const {
  // Default stream formatting prints bounds as written in the table: 1, 0.5, -1.
  std::ostringstream os;
  if (sentinel) os << *sentinel << " or ";
  if (lo && hi) {
    os << "in " << (lo_open ? "(" : "[") << *lo << ", " << *hi << (hi_open ? ")" : "]");
  } else if (lo) {
    os << (lo_open ? "> " : ">= ") << *lo;
  } else if (hi) {
    os << (hi_open ? "< " : "<= ") << *hi;
  }
  return os.str();
}

}  // namespace titan::trainer::config_detail
