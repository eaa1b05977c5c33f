// The fused RNN cells. For PrivateUse1 inputs ATen's LSTM and GRU cells
// (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, torch.lstm_cell, ...) do not
// decompose: like for CUDA they call _thnn_fused_lstm_cell /
// _thnn_fused_gru_cell, and autograd calls their backward kernels. Neither
// has a CPU kernel, so the CPU fallback cannot run them; OpenReg implements
// the four kernels here from device operators (each runs on the device).
//
// The workspace is the kernels' own business (autograd hands the forward's
// workspace to the backward unchanged): the activated gates of the LSTM,
// and the GRU's r, z, n, hx and the hidden state's n gate.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace openreg {

namespace {

at::Tensor with_biases(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

void check_gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                 const at::Tensor& state, int64_t gates, const char* op) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes().equals(hidden_gates.sizes()),
              op, ": input_gates ", input_gates.sizes(), " and hidden_gates ",
              hidden_gates.sizes(), " must be equal 2-d shapes");
  TORCH_CHECK(state.dim() == 2 && input_gates.size(0) == state.size(0) &&
                  input_gates.size(1) == gates * state.size(1),
              op, ": the gates ", input_gates.sizes(), " must be [batch, ", gates,
              " * hidden] for the state ", state.sizes());
}

// ------------------------------------------------------------------- LSTM

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_gates(input_gates, hidden_gates, cx, 4, "_thnn_fused_lstm_cell");
  const at::Tensor gates = with_biases(with_biases(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  const at::Tensor i = chunks[0].sigmoid();
  const at::Tensor f = chunks[1].sigmoid();
  const at::Tensor g = chunks[2].tanh();
  const at::Tensor o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const bool has_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_hy && !has_cy) return {at::Tensor(), at::Tensor(), at::Tensor()};
  auto gates = workspace.chunk(4, 1);
  const at::Tensor &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  const at::Tensor tanh_cy = cy.tanh();
  at::Tensor grad_c = has_cy ? grad_cy->clone() : at::zeros_like(cy);
  at::Tensor grad_o = at::zeros_like(o);
  if (has_hy) {
    grad_c = grad_c + *grad_hy * o * (1 - tanh_cy * tanh_cy);
    grad_o = *grad_hy * tanh_cy * o * (1 - o);
  }
  const at::Tensor grad_i = grad_c * g * i * (1 - i);
  const at::Tensor grad_f = grad_c * cx * f * (1 - f);
  const at::Tensor grad_g = grad_c * i * (1 - g * g);
  at::Tensor grad_gates = at::cat({grad_i, grad_f, grad_g, grad_o}, 1);
  at::Tensor grad_cx = grad_c * f;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

// -------------------------------------------------------------------- GRU

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_gates(input_gates, hidden_gates, hx, 3, "_thnn_fused_gru_cell");
  auto in = with_biases(input_gates, input_bias).chunk(3, 1);
  auto hid = with_biases(hidden_gates, hidden_bias).chunk(3, 1);
  const at::Tensor r = (in[0] + hid[0]).sigmoid();
  const at::Tensor z = (in[1] + hid[1]).sigmoid();
  const at::Tensor n = (in[2] + r * hid[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hid[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto parts = workspace.chunk(5, 1);
  const at::Tensor &r = parts[0], &z = parts[1], &n = parts[2], &hx = parts[3], &hn = parts[4];
  at::Tensor grad_hx = grad_hy * z;
  const at::Tensor grad_z = grad_hy * (hx - n) * z * (1 - z);
  const at::Tensor grad_n = grad_hy * (1 - z) * (1 - n * n);
  const at::Tensor grad_r = grad_n * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  const at::Tensor grad_hn = grad_n * r;
  at::Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_hn}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace openreg
