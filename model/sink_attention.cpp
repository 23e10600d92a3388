// model/sink_attention.cpp — see sink_attention.h.
#include "model/sink_attention.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "model/activation_checkpoint_ops.h"
#include "model/attention_blocks.h"
#include "model/document_attention.h"

namespace titan::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The pieces attention runs over independently: every row at once without documents, else each
// document of each row ([row, start, length]); its rows' positions are contiguous in both cases.
// Through autograd as a flat list (row, start, length, ...): a Function's tensor arguments must be
// defined, and the backward needs the pieces, not the document ids.
struct Piece {
  int64_t row = -1;  // -1: all rows
  int64_t start = 0, length = 0;
};
std::vector<int64_t> flat_pieces(const at::Tensor& documents, int64_t seq_len) {
  if (!documents.defined()) return {-1, 0, seq_len};
  std::vector<int64_t> flat;
  const std::vector<std::vector<DocumentSpan>> rows = document_spans(documents);
  for (size_t b = 0; b < rows.size(); ++b)
    for (const DocumentSpan& d : rows[b]) flat.insert(flat.end(), {static_cast<int64_t>(b), d.start, d.length});
  return flat;
}
std::vector<Piece> pieces_of(const std::vector<int64_t>& flat) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i + 2 < flat.size(); i += 3) pieces.push_back({flat[i], flat[i + 1], flat[i + 2]});
  return pieces;
}
// t [B, heads, S, ...]'s part of a piece (a view).
at::Tensor part(const at::Tensor& t, const Piece& p) {
  const at::Tensor rows = p.row < 0 ? t : t.narrow(0, p.row, 1);
  return p.start == 0 && p.length == t.size(2) ? rows : rows.narrow(2, p.start, p.length);
}

struct SinkAttention : public torch::autograd::Function<SinkAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& sinks, bool has_sinks, const std::vector<int64_t>& flat,
                               int64_t window, std::optional<double> scale) {
    const std::vector<Piece> pieces = pieces_of(flat);
    // out' and lse' kept or recomputed together (per-op AC keeps "sdpa").
    auto r = checkpointable_op_multi("sdpa", [&] {
      at::Tensor out, lse;
      if (pieces.size() == 1) {
        AttentionBlockResult whole = attention_block_forward(q, k, v, /*causal=*/true, scale, window);
        out = whole.out;
        lse = whole.lse;
      } else {
        out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
        lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
        for (const Piece& p : pieces) {
          const AttentionBlockResult b =
              attention_block_forward(part(q, p).contiguous(), part(k, p).contiguous(), part(v, p).contiguous(),
                                      /*causal=*/true, scale, window);
          part(out, p).copy_(b.out);
          part(lse, p).copy_(b.lse);
        }
      }
      if (has_sinks) {
        const SinkRescale s = rescale_by_sinks(lse, sinks);
        out = (out.to(at::kFloat) * s.factor).to(q.scalar_type());
        lse = s.lse;
      }
      return std::vector<at::Tensor>{out, lse};
    });
    ctx->save_for_backward({q, k, v, r[0], r[1], sinks});
    ctx->saved_data["has_sinks"] = has_sinks;
    ctx->saved_data["pieces"] = flat;
    ctx->saved_data["window"] = window;
    ctx->saved_data["scale"] = scale;
    return {r[0]};
  }

  // See Note [Attention sinks]: the flash backward from the final (out', lse'), plus the sinks'.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4], &sinks = s[5];
    const bool has_sinks = ctx->saved_data["has_sinks"].toBool();
    const int64_t window = ctx->saved_data["window"].toInt();
    const std::optional<double> scale = ctx->saved_data["scale"].toOptional<double>();
    const at::Tensor grad_out = grads[0].contiguous();
    const std::vector<Piece> pieces = pieces_of(ctx->saved_data["pieces"].toIntVector());
    at::Tensor dq, dk, dv;
    if (pieces.size() == 1) {
      std::tie(dq, dk, dv) = attention_block_backward(grad_out, q, k, v, out, lse, /*causal=*/true, scale, window);
    } else {
      dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
      dk = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
      dv = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
      for (const Piece& p : pieces) {
        auto g = attention_block_backward(part(grad_out, p).contiguous(), part(q, p).contiguous(),
                                          part(k, p).contiguous(), part(v, p).contiguous(), part(out, p).contiguous(),
                                          part(lse, p).contiguous(), /*causal=*/true, scale, window);
        part(dq, p).copy_(std::get<0>(g));
        part(dk, p).copy_(std::get<1>(g));
        part(dv, p).copy_(std::get<2>(g));
      }
    }
    const at::Tensor dsinks = has_sinks ? sinks_gradient(grad_out, out, lse, sinks).to(sinks.scalar_type())
                                              : at::Tensor();
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dsinks, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SinkRescale rescale_by_sinks(const at::Tensor& lse, const at::Tensor& sinks) {
  TORCH_CHECK(lse.dim() == 3 && sinks.dim() == 1 && sinks.size(0) == lse.size(1), "attention sinks: ", sinks.sizes(),
              " sinks for an lse of ", lse.sizes(), " (one sink per head expected)");
  const at::Tensor lse_sink = at::logaddexp(lse, sinks.to(at::kFloat).view({1, -1, 1}));
  return {lse_sink, at::exp(lse - lse_sink).unsqueeze(-1)};
}

at::Tensor sinks_gradient(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse,
                          const at::Tensor& sinks) {
  const at::Tensor delta = (grad_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1);  // [B, H, S]
  const at::Tensor p_sink = at::exp(sinks.to(at::kFloat).view({1, -1, 1}) - lse);
  return -(p_sink * delta).sum(at::IntArrayRef{0, 2});
}

at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                          int64_t window, const at::Tensor& sinks, std::optional<double> scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(2) == q.size(2) && v.size(2) == q.size(2),
              "sink attention: q [B, H, S, qk_hd], k [B, KV, S, qk_hd], v [B, KV, S, v_hd] expected, got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(window >= 0, "sink attention: the sliding window must be >= 0 (0: none), got ", window);
  TORCH_CHECK(!documents.defined() || (documents.dim() == 2 && documents.size(0) == q.size(0) &&
                                       documents.size(1) == q.size(2)),
              "sink attention: documents [B, S] = [", q.size(0), ", ", q.size(2), "] expected, got ",
              documents.sizes());
  // No sinks: an empty stand-in (a Function's tensor arguments must be defined), never read.
  const bool has_sinks = sinks.defined();
  return SinkAttention::apply(q, k, v, has_sinks ? sinks : at::empty({0}, q.options().dtype(at::kFloat)), has_sinks,
                              flat_pieces(documents, q.size(2)), window, scale)[0];
}

}  // namespace titan::model
