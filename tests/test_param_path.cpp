// A block's paths ("layers.<i>[.<rest>]") built and taken apart in one place (model/param_path.h).
#include "model/param_path.h"

#include <catch2/catch.hpp>

using titan::model::layer_path;
using titan::model::layer_pattern;
using titan::model::LayerPath;
using titan::model::parse_layer_path;
using titan::model::top_module;

TEST_CASE("layer paths: built, parsed, patterned, their top module", "[model]") {
  CHECK(layer_path(3) == "layers.3");
  CHECK(layer_path(12, "attention.wq.weight") == "layers.12.attention.wq.weight");

  const auto parsed = parse_layer_path("layers.12.attention.wq.weight");
  REQUIRE(parsed);
  CHECK(parsed->layer == 12);
  CHECK(parsed->rest == "attention.wq.weight");
  const auto block = parse_layer_path("layers.0");
  REQUIRE(block);
  CHECK(block->layer == 0);
  CHECK(block->rest.empty());
  CHECK(parse_layer_path("layers.007")->layer == 7);
  CHECK(parse_layer_path("layers.999999999")->layer == 999999999);  // 9 digits: the most a name may have

  // Not a block's path: another module, no index, a stray dot or letter, 10 digits (std::stoll of a
  // longer one could overflow; no model has so many layers).
  for (const char* other : {"norm.weight", "output", "tok_embeddings.weight", "layers", "layers.", "layers.x",
                            "layers.3.", "layers.3x.attention", "layers.-1", "layers.1234567890", "mylayers.3"})
    CHECK_FALSE(parse_layer_path(other));

  // Another folder of layers: Hugging Face's names, an expert index inside a block.
  const auto hf = parse_layer_path("model.layers.5.self_attn.q_proj.weight", "model.layers.");
  REQUIRE(hf);
  CHECK(hf->layer == 5);
  CHECK(hf->rest == "self_attn.q_proj.weight");
  const auto expert = parse_layer_path("mlp.experts.17.gate_proj.weight", "mlp.experts.");
  REQUIRE(expert);
  CHECK(expert->layer == 17);
  CHECK(expert->rest == "gate_proj.weight");
  CHECK_FALSE(parse_layer_path("layers.5.attention", "model.layers."));
  // ... built by layer_path with the same prefix.
  CHECK(layer_path(5, "self_attn.q_proj.weight", "model.layers.") == "model.layers.5.self_attn.q_proj.weight");
  CHECK(layer_path(17, "gate_proj.weight", "mlp.experts.") == "mlp.experts.17.gate_proj.weight");

  CHECK(layer_pattern("layers.3.attention.wq") == "layers.*.attention.wq");
  CHECK(layer_pattern("layers.3.attention.wq", "#") == "layers.#.attention.wq");
  CHECK(layer_pattern("layers.3") == "layers.*");
  CHECK(layer_pattern("output") == "output");

  CHECK(top_module("layers.3.attention.wq.weight") == "layers.3");
  CHECK(top_module("layers.3") == "layers.3");
  CHECK(top_module("norm.weight") == "norm");
  CHECK(top_module("output") == "output");
}
