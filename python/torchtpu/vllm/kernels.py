"""PyTorch forms of the Triton kernels vLLM's V1 model runner launches (Triton has no tpu
target), registered through vLLM's kernel override registry."""
import torch


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
                         block_table_stride, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1,
                         TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024):  # noqa: N803
    """block_table.ComputeSlotMappingKernel: the KV cache slot of each scheduled token (its
    request's block for its position, and the offset in it); PAD_ID after the last token."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("vLLM on tpu: context parallelism is not supported")
    token = torch.arange(num_tokens, device=positions_ptr.device)
    req = torch.searchsorted(query_start_loc_ptr[1:].long(), token, right=True)
    pos = positions_ptr[:num_tokens].long()
    block = block_table_ptr.reshape(-1)[req * block_table_stride + pos // KV_CACHE_BLOCK_SIZE].long()
    slot_mapping_ptr[:num_tokens] = block * KV_CACHE_BLOCK_SIZE + pos % KV_CACHE_BLOCK_SIZE
    slot_mapping_ptr[num_tokens:max_num_tokens] = PAD_ID


OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
}
