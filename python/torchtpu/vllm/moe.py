"""vLLM's unquantized fused mixture-of-experts layer on tpu. vLLM leaves an out-of-tree
platform's MoE to the platform (its fused-MoE kernels are CUDA and Triton): this form routes
the tokens to their experts with PyTorch ops and runs every expert's two matmuls as one
grouped matmul each (torch._grouped_mm over the tokens sorted by expert), so the shapes depend
only on the token count, never on how the router split the tokens. The router is vLLM's own
PyTorch one (the one its CPU platform uses); its other routers call CUDA kernels."""
import torch
import torch.nn.functional as F
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.fused_moe import layer as moe_layer
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter
from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

# The activations between the two matmuls: gated ones take [gate | up] halves.
_GATED = {
    MoEActivation.SILU: F.silu,
    MoEActivation.GELU: F.gelu,
    MoEActivation.GELU_TANH: lambda t: F.gelu(t, approximate="tanh"),
}
_PLAIN = {
    MoEActivation.SILU_NO_MUL: F.silu,
    MoEActivation.GELU_NO_MUL: F.gelu,
    MoEActivation.GELU_TANH_NO_MUL: lambda t: F.gelu(t, approximate="tanh"),
}


def _activate(h, activation):
    if activation in _GATED:
        gate, up = h.chunk(2, dim=-1)
        return _GATED[activation](gate) * up
    if activation in _PLAIN:
        return _PLAIN[activation](h)
    raise NotImplementedError(f"vLLM on tpu: MoE activation {activation.value} is not supported")


def fused_experts(x, w13, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input=False,
                  w13_bias=None, w2_bias=None):
    """sum over each token's top-k experts e of weight * w2[e] @ act(w13[e] @ x)."""
    tokens, k = topk_ids.shape
    experts = w13.shape[0]
    flat = topk_ids.reshape(-1).long()
    order = flat.argsort(stable=True)  # the (token, choice) pairs grouped by expert
    token = order // k
    weight = topk_weights.reshape(-1)[order].to(x.dtype)[:, None]
    rows = x[token]
    if apply_router_weight_on_input:
        rows = rows * weight
    ends = torch.bincount(flat, minlength=experts).cumsum(0).to(torch.int32)
    h = torch._grouped_mm(rows, w13.transpose(-1, -2), offs=ends)
    if w13_bias is not None:
        h = h + w13_bias[flat[order]]
    y = torch._grouped_mm(_activate(h, activation), w2.transpose(-1, -2), offs=ends)
    if w2_bias is not None:
        y = y + w2_bias[flat[order]]
    if not apply_router_weight_on_input:
        y = y * weight
    return x.new_zeros(tokens, y.shape[-1]).index_add_(0, token, y)


@CustomOp.register_oot(name="UnquantizedFusedMoEMethod")
class TpuUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    @property
    def is_monolithic(self):
        return False  # routing comes in as top-k ids and weights (vLLM's router runs first)

    def forward_oot(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if layer.expert_map is not None:
            raise NotImplementedError("vLLM on tpu: expert parallelism is not supported")
        out = fused_experts(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, layer.activation,
                            layer.apply_router_weight_on_input, getattr(layer, "w13_bias", None),
                            getattr(layer, "w2_bias", None))
        if shared_experts is not None:
            # As vLLM's modular kernels do: the shared experts keep their output for the runner.
            shared_experts(shared_experts_input, SharedExpertsOrder.MK_INTERNAL_OVERLAPPED)
        return out


def _create_router(*, zero_expert_type=None, **kw):
    """vLLM's router factory picks its PyTorch router (CPURouter) only on its CPU platform; on
    tpu it is the one to use for every scheme it covers."""
    if zero_expert_type is not None:
        return _vllm_create_router(zero_expert_type=zero_expert_type, **kw)
    fields = ("top_k", "global_num_experts", "use_grouped_topk", "num_expert_group", "topk_group", "renormalize",
              "scoring_func", "routed_scaling_factor", "e_score_correction_bias", "custom_routing_function",
              "hash_indices_table", "eplb_state")
    return CPURouter(**{k: kw[k] for k in fields if k in kw})


_vllm_create_router = moe_layer.create_fused_moe_router
moe_layer.create_fused_moe_router = _create_router
