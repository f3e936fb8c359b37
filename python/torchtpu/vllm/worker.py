"""vLLM's GPU worker and V1 model runner on device "tpu".

The model runner is vLLM's own: its CUDA stream and event calls go to torch.tpu's (one queue
per device, like one CUDA stream), and CUDA graphs are off (the platform turns them off). The
worker picks the process's tpu device, joins vLLM's process groups over the tccl backend and
takes the memory snapshot vLLM sizes the KV cache from (torch.accelerator's memory stats)."""
import contextlib
import dataclasses
import gc
import os
import time
from functools import partial

import torch
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import request_memory

from . import moe  # noqa: F401  (registers the MoE layer's tpu form)
from .attention import bucket
from .platform import on_host

logger = init_logger("vllm." + __name__)  # under "vllm": vLLM configures that logger tree


def _route_cuda_calls_to_tpu():
    """torch.cuda's stream and event entry points, as the model runner calls them while it runs,
    on tpu. For the life of the worker process (as vLLM's XPU runner does for xpu)."""

    def event(*args, blocking=False, external=False, **kwargs):
        return torch.tpu.Event(*args, blocking=blocking, **kwargs)

    torch.cuda.Stream = torch.tpu.Stream
    torch.cuda.Event = event
    torch.cuda.current_stream = partial(torch.tpu.current_stream)
    torch.cuda.default_stream = partial(torch.tpu.default_stream)
    torch.cuda.stream = partial(torch.tpu.stream)
    torch.cuda.set_stream = partial(torch.tpu.set_stream)
    torch.cuda.synchronize = partial(torch.tpu.synchronize)


class _GatheredAtInBuckets(torch.Tensor):
    """The step's logits indices (each request's last scheduled token). The model's hidden
    states are gathered at them in a bucketed-programs scope: one program per bucket of the
    request count, rather than one per count (a count that comes back would also compile a
    program of its own). Every other use sees a plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__getitem__ and isinstance(args[1], cls):
                with torch.tpu.bucketed_programs():
                    return func(*args)
            return func(*args, **(kwargs or {}))


class TpuModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device):
        _route_cuda_calls_to_tpu()
        super().__init__(vllm_config, device)

    # vLLM's input preparation, and its padding of a step's inputs to the padded token count,
    # work on views of its step buffers cut to the step's token and request counts, which
    # change at almost every step: their ops run bucketed programs (one per power-of-two
    # bucket of sizes) rather than compiling each new count.
    def _prepare_inputs(self, *args, **kwargs):
        with torch.tpu.bucketed_programs():
            logits_indices, *rest = GPUModelRunner._prepare_inputs(self, *args, **kwargs)
        return (logits_indices.as_subclass(_GatheredAtInBuckets), *rest)

    def _prepare_input_ids(self, *args, **kwargs):
        # With async scheduling, the previous step's sampled tokens ([requests, 1], on the
        # device) are copied into this step's inputs at the requests that carry on: a gather
        # at a list of rows and a scatter at a list of positions, the lists uploaded per step.
        # Those run in the input preparation's scope, where the uploads hold their bucket
        # (engine host.rs); the sampled tokens are first copied into a buffer of the batch's
        # most requests, so that the gather's programs do not also come per request count.
        prev = self.input_batch.prev_sampled_token_ids
        if prev is None or prev.dim() != 2 or prev.shape[1] != 1 or prev.shape[0] > self.max_num_reqs:
            return GPUModelRunner._prepare_input_ids(self, *args, **kwargs)
        held = getattr(self, "_prev_sampled_held", None)
        if held is None or held.dtype != prev.dtype:
            held = self._prev_sampled_held = torch.zeros(self.max_num_reqs, 1, dtype=prev.dtype, device=prev.device)
        held[:prev.shape[0]].copy_(prev)
        self.input_batch.prev_sampled_token_ids = held
        try:
            return GPUModelRunner._prepare_input_ids(self, *args, **kwargs)
        finally:
            self.input_batch.prev_sampled_token_ids = prev

    _preprocess = torch.tpu.bucketed_programs()(GPUModelRunner._preprocess)
    _prepare_padding_mask = torch.tpu.bucketed_programs()(GPUModelRunner._prepare_padding_mask)
    _get_slot_mappings = torch.tpu.bucketed_programs()(GPUModelRunner._get_slot_mappings)

    def _determine_batch_execution_and_padding(self, num_tokens, *args, **kwargs):
        # A step's tokens are padded to a power of two (as CUDA graph capture sizes pad them),
        # so that the model's programs come in a bounded set of sizes; the attention metadata
        # pads to the same size (attention.bucket).
        result = list(super()._determine_batch_execution_and_padding(num_tokens, *args, **kwargs))
        padded = bucket(num_tokens, self.max_num_tokens)
        if result[1].num_tokens < padded:
            result[1] = dataclasses.replace(result[1], num_tokens=padded)
        return tuple(result)


def warm_up_padded_sizes(worker):
    """Runs the model (attention included) once as a decode step at each padded request count
    and once at each padded token count (as vLLM spreads its dummy steps), so that a server meets
    those programs compiled (or loaded from the persistent cache) rather than mid-request.
    TORCHTPU_VLLM_WARMUP=0 skips it."""
    if os.environ.get("TORCHTPU_VLLM_WARMUP", "1") == "0":
        return
    runner = worker.model_runner

    def padded_sizes(cap):
        return sorted({bucket(1 << i, cap) for i in range(cap.bit_length())} | {cap})

    # Decode steps of each padded request count (one token each), then steps of each padded
    # token count spread over as many requests as the batch allows.
    runs = [(n, True) for n in padded_sizes(runner.max_num_reqs)]
    runs += [(n, False) for n in padded_sizes(runner.max_num_tokens)]
    for i, (n, decode) in enumerate(runs, 1):
        start = time.perf_counter()
        runner._dummy_run(n, cudagraph_runtime_mode=CUDAGraphMode.NONE, force_attention=True, uniform_decode=decode,
                          skip_eplb=True)
        logger.info("vLLM on tpu: warm-up %d/%d: %s of %d tokens, %.2f s", i, len(runs),
                    "decode" if decode else "prefill", n, time.perf_counter() - start)
    start = time.perf_counter()
    steps = warm_up_input_preparation(runner)
    logger.info("vLLM on tpu: warm-up of input preparation: %d steps, %.2f s", steps, time.perf_counter() - start)


def _powers_of_two_to(cap):
    """1, 2, 4, ... below cap, and cap: the engine's buckets (bucketed_programs) up to cap."""
    return sorted({1 << i for i in range(max(cap, 1).bit_length()) if 1 << i < cap} | {cap})


def warm_up_input_preparation(runner):
    """Runs vLLM's whole step (input preparation, model, sampling, bookkeeping) on synthetic
    requests: a prefill of each power-of-two request count with each power-of-two token count,
    then a decode step of those requests, and prefills of those counts whose longest prompt is
    each longer power of two; a prefill of a token count below its padded size for
    each bucket of that padding; a request finishing at the front of the batch for each bucket
    of the rows that move; then a decode of the most requests the batch holds, one of them
    finishing at each step, down to one (a request set's falling count, and the batch
    condensing around each finished request). The runner's input preparation runs bucketed
    programs (one per power-of-two bucket of the step's token and request counts) and sampling
    a program per request count: this compiles them before the server meets a real request.
    The requests write KV cache blocks the scheduler has not handed out (any block a real
    request gets is written before it is read) and leave the runner as they found it. Returns
    the number of steps."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    block_size = runner.cache_config.block_size
    num_blocks = max(runner.kv_cache_config.num_blocks - 1, 1)  # block 0 is vLLM's null block
    groups = len(runner.kv_cache_config.kv_cache_groups)
    steps = 0

    def run(new=(), cached=None, scheduled=None, finished=()):
        nonlocal steps
        steps += 1
        scheduled = scheduled or {}
        out = SchedulerOutput(
            scheduled_new_reqs=list(new), scheduled_cached_reqs=cached or CachedRequestData.make_empty(),
            num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[0] * groups,
            finished_req_ids=set(finished), free_encoder_mm_hashes=[])
        if runner.execute_model(out) is None:
            result = runner.sample_tokens(None)
            if hasattr(result, "get_output"):
                result.get_output()

    def prefill(name, lengths, room):
        """New requests of these prompt lengths, each with blocks for `room` more tokens."""
        ids = [f"torchtpu-warm-up-{name}-{i}" for i in range(len(lengths))]
        new, next_block = [], 0
        greedy = SamplingParams(temperature=0.0, max_tokens=room)
        for req_id, n in zip(ids, lengths):
            blocks = [1 + (next_block + k) % num_blocks for k in range(-(-(n + room) // block_size))]
            next_block += len(blocks)
            new.append(NewRequestData(req_id=req_id, prompt_token_ids=[0] * n, mm_features=[], sampling_params=greedy,
                                      pooling_params=None, block_ids=(blocks,), num_computed_tokens=0,
                                      lora_request=None))
        run(new, scheduled=dict(zip(ids, lengths)))
        return ids

    def decode(ids, computed, outputs, finished=()):
        """One token for each of `ids` (each has its sampled tokens in the runner's state)."""
        cached = CachedRequestData(req_ids=list(ids), resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                                   new_block_ids=[None] * len(ids), num_computed_tokens=list(computed),
                                   num_output_tokens=list(outputs))
        run(cached=cached, scheduled={i: 1 for i in ids}, finished=finished)

    for reqs in _powers_of_two_to(runner.max_num_reqs):
        for tokens in _powers_of_two_to(runner.max_num_tokens):
            if tokens < reqs or -(-tokens // reqs) + 2 > runner.max_model_len:
                continue
            lengths = [tokens // reqs + (i < tokens % reqs) for i in range(reqs)]
            ids = prefill(f"{reqs}-{tokens}", lengths, 2)
            decode(ids, lengths, [1] * reqs)
            run(finished=ids)
            # The same counts with a longer longest prompt (attention pads each request's
            # query to the longest): one request of each power-of-two length, the others
            # sharing the rest.
            longest = 1 << (max(lengths) - 1).bit_length()
            while reqs > 1 and longest <= min(tokens - reqs + 1, runner.max_model_len - 2):
                if longest > max(lengths):
                    rest = tokens - longest
                    skewed = [longest] + [rest // (reqs - 1) + (i < rest % (reqs - 1)) for i in range(reqs - 1)]
                    run(finished=prefill(f"{reqs}-{tokens}-{longest}", skewed, 2))
                longest *= 2
    # Token counts below their padded size, one per (padded size, bucket of the padding):
    # the step buffers' partial copies and the padding's fills at each of their buckets.
    longest = runner.max_model_len - 2
    met = set()
    for tokens in range(1, runner.max_num_tokens + 1):
        padded = bucket(tokens, runner.max_num_tokens)
        reqs = -(-tokens // longest)
        shape = (padded, 1 << (padded - tokens - 1).bit_length())
        if padded == tokens or shape in met or reqs > runner.max_num_reqs:
            continue
        met.add(shape)
        lengths = [tokens // reqs + (i < tokens % reqs) for i in range(reqs)]
        run(finished=prefill(f"tokens-{tokens}", lengths, 2))
    most = min(runner.max_num_reqs, runner.max_num_tokens)
    # A request finishing at the front of the batch moves the last one into its row: the next
    # step copies the other requests' sampled tokens in a new order (a gather and a scatter of
    # as many rows), met here at each bucket of their number.
    for carried in _powers_of_two_to(most - 1) if most > 1 else ():
        ids = prefill(f"moved-{carried}", [1] * (carried + 1), 2)
        decode(ids[1:], [1] * carried, [1] * carried, finished=ids[:1])
        run(finished=ids[1:])
    if most + 2 <= runner.max_model_len:
        ids = prefill("falling", [1] * most, most + 1)
        for k in range(most):
            # The first request finishes as the others take their (k+1)-th decode step.
            ids, done = ids[1:], ids[:1]
            decode(ids, [1 + k] * len(ids), [1 + k] * len(ids), finished=done)
    return steps


class TpuWorker(Worker):
    def init_device(self):
        self.device = torch.device(f"tpu:{self.local_rank}")
        torch.tpu.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.accelerator.empty_cache()
        self.init_snapshot = MemorySnapshot(device=self.device)
        if on_host():
            # Host memory: other processes' use is not the engine's business; the KV cache
            # has a fixed budget (see the platform).
            self.requested_memory = self.init_snapshot.free_memory
        else:
            self.requested_memory = request_memory(self.init_snapshot, self.cache_config)
        self._init_workspace_and_model_runner()

    def _maybe_get_memory_pool_context(self, tag):
        if self.vllm_config.model_config.enable_sleep_mode:
            raise NotImplementedError("vLLM on tpu: sleep mode is not supported")
        return contextlib.nullcontext()

    def compile_or_warm_up_model(self):
        # vLLM's kernel warm-up tunes CUDA kernels (FlashInfer, DeepGEMM, Triton); on tpu its
        # place is taken by a warm-up of the padded step sizes.
        from vllm.v1.worker import gpu_worker

        saved, gpu_worker.kernel_warmup = gpu_worker.kernel_warmup, warm_up_padded_sizes
        try:
            return super().compile_or_warm_up_model()
        finally:
            gpu_worker.kernel_warmup = saved

    def _make_model_runner(self):
        return TpuModelRunner(self.vllm_config, self.device)
