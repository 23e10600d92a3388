// model/mtp.cpp — see mtp.h.
#include "model/mtp.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

namespace titan::model {

RolledSequence roll_sequence(const at::Tensor& sequence, int64_t shift, const at::Tensor& documents, int64_t fill) {
  TORCH_CHECK(sequence.dim() == 2, "roll_sequence: need [batch, seq], got ", sequence.sizes());
  const int64_t seq = sequence.size(1);
  TORCH_CHECK(shift >= 1 && shift <= seq, "multi-token prediction: the roll shift must be in [1, ", seq, "], got ",
              shift);
  RolledSequence out;
  out.values = at::full_like(sequence, fill);
  out.valid = at::zeros_like(sequence, sequence.options().dtype(at::kBool));
  const int64_t kept = seq - shift;
  if (kept == 0) return out;
  const at::Tensor source = sequence.narrow(1, shift, kept);
  at::Tensor valid = at::ones_like(source, source.options().dtype(at::kBool));
  if (documents.defined()) {
    TORCH_CHECK(documents.sizes() == sequence.sizes(), "roll_sequence: documents ", documents.sizes(),
                " do not match the sequence ", sequence.sizes());
    valid = documents.narrow(1, shift, kept) == documents.narrow(1, 0, kept);
  }
  out.valid.narrow(1, 0, kept).copy_(valid);
  out.values.narrow(1, 0, kept).copy_(at::where(valid, source, out.values.narrow(1, 0, kept)));
  return out;
}

MtpLossSum mtp_loss_sum(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& documents,
                        int64_t depths, double weight, const CrossEntropySum& ce_sum) {
  if (depths == 0) return {ce_sum(logits, labels), at::Tensor()};
  const int64_t rows = labels.size(0);
  TORCH_CHECK(logits.dim() == 3 && logits.size(0) == (1 + depths) * rows, "multi-token prediction: ", depths,
              " depths need logits [(1 + ", depths, ") x ", rows, ", seq, vocab], got ", logits.sizes());
  at::Tensor main = ce_sum(logits.narrow(0, 0, rows), labels);
  at::Tensor mtp;
  for (int64_t k = 1; k <= depths; ++k) {
    const at::Tensor rolled = roll_sequence(labels, k, documents, kIgnoreIndex).values;
    const at::Tensor depth = ce_sum(logits.narrow(0, k * rows, rows), rolled);
    mtp = mtp.defined() ? mtp + depth : depth;
  }
  const at::Tensor mean = mtp / static_cast<double>(depths);
  return {main + mean * weight, mean.detach()};
}

MtpParts::MtpParts(const std::string& path, const ModelArgs& args)
    : enorm(path + ".enorm", args.dim, args.norm_eps),
      hnorm(path + ".hnorm", args.dim, args.norm_eps),
      eh_proj(path + ".eh_proj", 2 * args.dim, args.dim),
      mtp_norm(path + ".mtp_norm", args.dim, args.norm_eps) {
  make_linear_meta(eh_proj);
}

at::Tensor MtpParts::fuse(const at::Tensor& x) const {
  const int64_t dim = x.size(-1) / 2;
  return eh_proj.forward(at::cat({enorm.forward(x.narrow(-1, 0, dim)), hnorm.forward(x.narrow(-1, dim, dim))}, -1));
}

// torchtitan's MTPTransformerBlock registers enorm, hnorm, eh_proj, mtp_norm in this order.
void MtpParts::visit_params(const ParamVisitor& visit) {
  enorm.visit_params(visit);
  hnorm.visit_params(visit);
  visit(eh_proj.fqn() + ".weight", eh_proj.weight);
  mtp_norm.visit_params(visit);
}

}  // namespace titan::model
