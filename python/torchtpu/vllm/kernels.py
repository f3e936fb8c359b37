"""PyTorch forms of the Triton kernels vLLM's V1 model runner launches (Triton has no tpu
target), registered through vLLM's kernel override registry."""
import torch

from .attention import _extend, bucket, padded_view


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
                         block_table_stride, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1,
                         TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024):  # noqa: N803
    """block_table.ComputeSlotMappingKernel: the KV cache slot of each scheduled token (its
    request's block for its position, and the offset in it); PAD_ID after the last token."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("vLLM on tpu: context parallelism is not supported")
    # Over the token count padded to its bucket (attention.bucket), so that the programs come
    # in a bounded set of sizes; the padding's slots are PAD_ID.
    padded = bucket(num_tokens, max_num_tokens)
    token = torch.arange(padded, device=positions_ptr.device)
    valid = token < torch.tensor(num_tokens)  # a value, not a constant of the program
    # vLLM passes views of its buffers cut to this step's sizes; past the requests the start
    # locations repeat the last (non-decreasing), past the tokens positions are padding.
    starts = padded_view(query_start_loc_ptr, max_num_tokens + 1)[1:].long()
    req = torch.searchsorted(starts, token, right=True)
    pos = _extend(positions_ptr, padded).long()
    entry = torch.where(valid, req * block_table_stride + pos // KV_CACHE_BLOCK_SIZE, 0)
    block = block_table_ptr.reshape(-1)[entry].long()
    slot = block * KV_CACHE_BLOCK_SIZE + pos % KV_CACHE_BLOCK_SIZE
    slot_mapping_ptr[:padded] = torch.where(valid, slot, PAD_ID)
    slot_mapping_ptr[padded:max_num_tokens] = PAD_ID

OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
}
