// model/param_path.h — the one owner of a block's paths: "layers.<i>" for the block and
// "layers.<i>.<rest>" for what it holds ("layers.3.attention.wq.weight"), the names torchtitan's
// state_dict, titan's checkpoints, the pipeline split and the logs share. Nothing else builds or
// takes apart such a name by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace titan::model {

// Multi-token prediction's blocks (model/mtp.h): "mtp_layers.<k>", torchtitan's names.
inline constexpr std::string_view kMtpLayersPrefix = "mtp_layers.";

// "layers.<layer>" (no rest) or "layers.<layer>.<rest>"; `prefix` as parse_layer_path's
// ("model.layers." builds Hugging Face's name of a block, "mlp.experts." of an HF expert).
std::string layer_path(int64_t layer, std::string_view rest = {}, std::string_view prefix = "layers.");

struct LayerPath {
  int64_t layer = 0;
  std::string rest;  // what follows "layers.<i>.": "" for the block itself
};
// "layers.12.attention.wq.weight" -> {12, "attention.wq.weight"}, "layers.3" -> {3, ""}; nullopt
// for any other name ("norm.weight", "layers.x", "layers.3.", an index of more than 9 digits, which
// no model has and std::stoll could overflow). `prefix` is the folder of numbered entries:
// "layers." in titan's names, "model.layers." in Hugging Face's, "mlp.experts." for HF's experts
// of a block.
std::optional<LayerPath> parse_layer_path(std::string_view path, std::string_view prefix = "layers.");

// A block's path with its index replaced: "layers.3.attention.wq" -> "layers.*.attention.wq" (for
// `index_mark` "*"), so that one line stands for every block; other paths as they are.
std::string layer_pattern(std::string_view path, std::string_view index_mark = "*");

// The top-level module a path belongs to: "layers.3.attention.wq.weight" -> "layers.3",
// "mtp_layers.0.enorm.weight" -> "mtp_layers.0", "norm.weight" -> "norm", "output" -> "output".
std::string top_module(std::string_view path);

}  // namespace titan::model
