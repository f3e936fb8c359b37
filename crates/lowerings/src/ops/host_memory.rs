//! Ops whose PyTorch kernels are device-generic but read or write tensor data as host memory
//! (found by `python -m torchtpu.tools.probe`: on tpu they faulted in the device address region).
//! They have no tpu lowering; routed here, they raise NotImplementedError naming the op.
use crate::{ops, Args, Cx, ErrorKind, Op, Out, Result, TorchError};

pub(crate) const OPS: &[Op] = &[
    ops(&["_grid_sampler_2d_cpu_fallback", "_grid_sampler_2d_cpu_fallback_backward"], reads_host_memory)
        .routed(&["_grid_sampler_2d_cpu_fallback", "_grid_sampler_2d_cpu_fallback.out", "_grid_sampler_2d_cpu_fallback_backward"]),
    ops(&["_nnpack_spatial_convolution"], reads_host_memory).routed(&["_nnpack_spatial_convolution", "_nnpack_spatial_convolution.out"]),
    ops(&["_saturate_weight_to_fp16"], reads_host_memory).routed(&["_saturate_weight_to_fp16"]),
    ops(&["choose_qparams_optimized"], reads_host_memory).routed(&["choose_qparams_optimized"]),
    ops(&["fbgemm_linear_quantize_weight", "fbgemm_pack_gemm_matrix_fp16"], reads_host_memory)
        .routed(&["fbgemm_linear_quantize_weight", "fbgemm_pack_gemm_matrix_fp16"]),
    // torch 2.11's kernel (later releases register it for CPU only).
    ops(&["_sobol_engine_initialize_state"], reads_host_memory).routed(&["_sobol_engine_initialize_state_"]),
];

fn reads_host_memory(_: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    Err(TorchError::new(
        ErrorKind::NotImplemented,
        format!(
            "The operator 'aten::{}' is not currently implemented for the tpu device: its PyTorch kernel reads tensor \
             data as host memory. Move its inputs to the CPU to run it there.",
            args.op
        ),
    ))
}
