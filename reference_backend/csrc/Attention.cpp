// Scaled dot-product attention through PyTorch's extension point for
// out-of-tree devices.
//
// F.scaled_dot_product_attention (aten/src/ATen/native/transformers/
// attention.cpp) asks the device type's _fused_sdp_choice_stub which kernel
// to run; a device type without one gets the math decomposition. A
// PrivateUse1 backend registers the stub and answers SDPBackend::overrideable
// for the inputs its fused kernel takes; attention.cpp then calls
// aten::_scaled_dot_product_fused_attention_overrideable (boolean masks
// already converted to additive float masks), and autograd calls
// aten::_scaled_dot_product_fused_attention_overrideable_backward with the
// forward's output and logsumexp.
//
// OpenReg's kernel is one pass over device operators: scores, the row
// logsumexp (float32), probabilities, output. The backward recomputes the
// probabilities from the logsumexp (as fused kernels do, instead of keeping
// the L x S matrix). Half-precision inputs are computed in float32. Dropout
// is not fused: for dropout_p > 0 the choice is the math path, which
// implements it with the device's random generator.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/SDPBackend.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>
#include <tuple>

namespace openreg {

namespace {

using at::SDPBackend;

// Whether the fused kernel takes these inputs: same floating dtype,
// 3-d or 4-d, the same batch dimensions (no broadcasting), no dropout, the
// same number of heads (grouped-query attention goes to the math path).
bool fused_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p) {
  if (q.is_nested() || k.is_nested() || v.is_nested()) return false;
  if (dropout_p > 0.0) return false;
  if (!at::isFloatingType(q.scalar_type()) || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type()) {
    return false;
  }
  // 3-d (heads, sequence, embedding) or 4-d (batch, heads, ...), as
  // PyTorch's meta kernel for the operator assumes.
  if ((q.dim() != 3 && q.dim() != 4) || k.dim() != q.dim() || v.dim() != q.dim()) return false;
  const auto batch = q.sizes().slice(0, q.dim() - 2);
  return batch.equals(k.sizes().slice(0, k.dim() - 2)) && batch.equals(v.sizes().slice(0, v.dim() - 2)) &&
         k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
}

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  const bool overrideable_allowed = ctx.userEnabledOverrideableSDP();
  if (overrideable_allowed && fused_takes(query, key, value, dropout_p)) {
    return static_cast<int64_t>(SDPBackend::overrideable);
  }
  if (ctx.userEnabledMathSDP()) return static_cast<int64_t>(SDPBackend::math);
  // attention.cpp raises "No viable backend for scaled_dot_product_attention
  // was found." for this answer, as for CUDA when every usable backend is
  // disabled.
  return static_cast<int64_t>(SDPBackend::error);
}

at::ScalarType compute_type(const at::Tensor& t) {
  return at::isReducedFloatingType(t.scalar_type()) ? at::kFloat : t.scalar_type();
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// The scaled, masked scores, in the compute type.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& attn_bias, bool is_causal,
                  double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (is_causal) {
    // Top-left aligned, as in the math path: query i sees keys 0..i.
    const at::Tensor keep = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).tril();
    s.masked_fill_(keep.logical_not(), -std::numeric_limits<double>::infinity());
  }
  if (attn_bias.defined()) s = s + attn_bias.to(s.scalar_type());
  return s;
}

// exp(scores - logsumexp), with rows that see no key (logsumexp -inf) all
// zero. `lse` has one value per row of `s`, in any shape.
at::Tensor probabilities(const at::Tensor& s, const at::Tensor& lse) {
  const at::Tensor row = lse.to(s.scalar_type()).reshape(s.sizes().slice(0, s.dim() - 1)).unsqueeze(-1);
  return at::where(row.isneginf(), at::zeros({}, s.options()), (s - row).exp());
}

// `out` copied into a tensor whose dimensions are laid out in the order of
// `like`'s strides (outermost first), as PyTorch's meta kernel allocates it.
at::Tensor in_layout_of(const at::Tensor& like, const at::Tensor& out) {
  std::vector<int64_t> order(like.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> sizes(order.size());
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    sizes[i] = out.size(order[i]);
    back[order[i]] = static_cast<int64_t>(i);
  }
  at::Tensor result = at::empty(sizes, out.options()).permute(back);
  result.copy_(out);
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
sdpa_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
             const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal, bool return_debug_mask,
             std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0,
              "_scaled_dot_product_fused_attention_overrideable on openreg: dropout_p must be 0 (got ", dropout_p,
              "); scaled_dot_product_attention runs dropout on the math path");
  TORCH_CHECK(fused_takes(query, key, value, 0.0),
              "_scaled_dot_product_fused_attention_overrideable on openreg: query ", query.sizes(), ", key ",
              key.sizes(), " and value ", value.sizes(),
              " must be floating tensors of one dtype with the same batch dimensions, key and query the same "
              "embedding size and key and value the same sequence length");
  const at::ScalarType ct = compute_type(query);
  const at::Tensor q = query.to(ct), k = key.to(ct), v = value.to(ct);
  const at::Tensor bias = attn_bias.has_value() ? *attn_bias : at::Tensor();
  const at::Tensor s = scores(q, k, bias, is_causal, scale_of(query, scale));
  const at::Tensor row_lse = at::logsumexp(s, -1);
  const at::Tensor p = probabilities(s, row_lse);
  // The shapes, dtypes and layout PyTorch's meta kernel promises (what
  // torch.compile assumes): the output in the query's dimension order, the
  // logsumexp as float32 [batch, heads, queries] (batch 1 for 3-d inputs),
  // 0-d seed and offset.
  at::Tensor out = in_layout_of(query, at::matmul(p, v).to(query.scalar_type()));
  at::Tensor lse = row_lse.to(at::kFloat);
  if (query.dim() == 3) lse = lse.unsqueeze(0);
  const auto none = query.options().dtype(at::kLong);
  return {out,
          lse,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(query.size(-2)),
          c10::SymInt(key.size(-2)),
          at::empty({}, none),
          at::empty({}, none),
          return_debug_mask ? p.to(query.scalar_type()) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, int64_t max_q,
    int64_t max_k, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0,
              "_scaled_dot_product_fused_attention_overrideable_backward on openreg: dropout_p must be 0 (got ",
              dropout_p, ")");
  if (!grad_out.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  const at::ScalarType ct = compute_type(query);
  const at::Tensor q = query.to(ct), k = key.to(ct), v = value.to(ct), g = grad_out.to(ct);
  const double factor = scale_of(query, scale);
  const at::Tensor s = scores(q, k, attn_bias, is_causal, factor);
  const at::Tensor p = probabilities(s, logsumexp);
  // d(softmax): dS = P * (dP - rowsum(P * dP)).
  const at::Tensor dp = at::matmul(g, v.transpose(-2, -1));
  const at::Tensor ds = p * (dp - (p * dp).sum(-1, /*keepdim=*/true));
  at::Tensor grad_q, grad_k, grad_v, grad_bias;
  if (grad_input_mask[0]) grad_q = at::matmul(ds, k).mul_(factor).to(query.scalar_type());
  if (grad_input_mask[1]) grad_k = at::matmul(ds.transpose(-2, -1), q).mul_(factor).to(key.scalar_type());
  if (grad_input_mask[2]) grad_v = at::matmul(p.transpose(-2, -1), g).to(value.scalar_type());
  if (grad_input_mask[3] && attn_bias.defined()) {
    grad_bias = at::sum_to(ds, attn_bias.sym_sizes()).to(attn_bias.scalar_type());
  }
  return {grad_q, grad_k, grad_v, grad_bias};
}

// scaled_dot_product_attention asks this stub which kernel runs on OpenReg.
bool register_choice() {
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice);
  return true;
}
const bool choice_registered = register_choice();
}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_backward));
}

}  // namespace openreg
