"""Checking ops on "tpu" against PyTorch on CPU."""
import torch

TPU = torch.device("tpu")

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32]
ALL = FLOATS + INTS + [torch.bool]


def make(shape, dtype=torch.float32, low=None, high=None):
    """Random CPU data of a dtype (positive when `low` >= 0)."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        lo = -3.0 if low is None else low
        hi = 3.0 if high is None else high
        return (torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    lo = (0 if dtype == torch.uint8 else -9) if low is None else int(low)
    hi = 10 if high is None else int(high)
    return torch.randint(lo, hi, shape, dtype=dtype)


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.to(TPU)
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(v) for v in x)
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        assert x.device.type == "tpu", f"expected a tpu result, got {x.device}"
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def tolerance(dtype):
    if dtype in (torch.bfloat16,):
        return dict(atol=2e-2, rtol=2e-2)
    if dtype in (torch.float16,):
        return dict(atol=2e-3, rtol=2e-3)
    return {}


def check(fn, *args, atol=None, rtol=None, **kwargs):
    """fn(*args) on CPU and on tpu give the same values, dtypes and shapes."""
    expected = fn(*args, **kwargs)
    got = to_cpu(fn(*to_tpu(args), **to_tpu(kwargs)))
    assert_matches_cpu(got, expected, atol, rtol)
    return got


def check_or_error(fn, *args, **kwargs):
    """Like `check`, or, where CPU rejects the input, the same exception class on tpu."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - any exception CPU raises is the expected outcome
        check_error(fn, *args)
        return None
    return check(fn, *args, **kwargs)


def assert_matches_cpu(got, expected, atol=None, rtol=None):
    """A result (tensors on tpu or already on the host, or nested lists of them, or numbers)
    equals CPU's: values, dtypes and shapes, to the dtype's tolerance unless given."""
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_matches_cpu(g, e, atol, rtol)
        return
    if isinstance(got, torch.Tensor) and got.device.type == "tpu":
        got = got.cpu()
    if not isinstance(expected, torch.Tensor):
        assert got == expected
        return
    tol = tolerance(expected.dtype)
    if atol is not None:
        tol = dict(atol=atol, rtol=rtol if rtol is not None else atol)
    torch.testing.assert_close(got, expected, equal_nan=True, **tol)


def check_inplace(fn, base, *args, **kwargs):
    """fn mutates its first argument: compare the mutated tensors."""
    cpu = base.clone()
    fn(cpu, *args, **kwargs)
    dev = base.to(TPU)
    fn(dev, *to_tpu(args), **to_tpu(kwargs))
    assert_matches_cpu(dev, cpu)


def views(t):
    """Non-contiguous views of a >= 2-d CPU tensor with the same logical shape family."""
    yield "transposed", lambda x: x.transpose(0, 1)
    yield "stepped", lambda x: x[::2]
    yield "expanded", lambda x: x[:1].expand(x.shape)


def check_error(fn, *args, first_line=False, **kwargs):
    """fn raises the same exception class on tpu as on CPU (and, with first_line, the same
    first line of its message); returns tpu's exception."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        cpu, cls = e, type(e)
    else:
        raise AssertionError("expected the CPU call to raise")
    try:
        fn(*to_tpu(args), **to_tpu(kwargs))
    except Exception as e:  # noqa: BLE001
        assert isinstance(e, cls), f"tpu raised {type(e).__name__}: {e}; CPU raised {cls.__name__}"
        if first_line:
            assert str(e).split("\n")[0] == str(cpu).split("\n")[0], f"tpu: {e}\ncpu: {cpu}"
        return e
    raise AssertionError(f"tpu did not raise; CPU raised {cls.__name__}")


def check_grads(fn, *inputs, needs=None, atol=None, rtol=None, grad_out=None):
    """fn(*inputs) and the gradients of the inputs flagged in `needs` (default: the first)
    agree on CPU and tpu; grad_out is the incoming gradient (random by default)."""
    needs = needs or [i == 0 for i in range(len(inputs))]
    cpu = [x.detach().clone().requires_grad_(n) if isinstance(x, torch.Tensor) and n else x for x, n in zip(inputs, needs)]
    tpu = [x.detach().to(TPU).requires_grad_(n) if isinstance(x, torch.Tensor) and n
           else (x.to(TPU) if isinstance(x, torch.Tensor) else x) for x, n in zip(inputs, needs)]
    yc = fn(*cpu)
    yt = fn(*tpu)
    g = grad_out if grad_out is not None else make(yc.shape, yc.dtype)
    yc.backward(g)
    yt.backward(g.to(TPU))
    tol = {} if atol is None else dict(atol=atol, rtol=rtol if rtol is not None else atol)
    torch.testing.assert_close(yt.detach().cpu(), yc.detach(), equal_nan=True, **tol)
    for c, d, n in zip(cpu, tpu, needs):
        if n:
            assert d.grad is not None, "no gradient reached a tpu input"
            torch.testing.assert_close(d.grad.cpu(), c.grad, equal_nan=True, **tol)


def greedy(model, inputs, max_new_tokens, **kwargs):
    """CPU's greedy generation with the scores it chose each token by, for assert_same_greedy."""
    return model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                          output_scores=True, return_dict_in_generate=True, **kwargs)


def assert_same_greedy(got, ref, tie=1e-4):
    """Token ids generated on tpu are CPU's greedy generation `ref` (from greedy()), except at a
    near tie: where they first differ, CPU's score for tpu's token must be within `tie` (the
    tolerance logits are compared to) of CPU's best, a choice float rounding may make either way
    on any machine; the continuations after it are not compared."""
    got, seqs = got.cpu(), ref.sequences
    start = seqs.shape[1] - len(ref.scores)
    n = min(got.shape[1], seqs.shape[1])
    for b in range(seqs.shape[0]):
        diff = (got[b, :n] != seqs[b, :n]).nonzero()
        if len(diff) == 0:
            assert got.shape[1] == seqs.shape[1] or got[b, n:].eq(0).all() and seqs[b, n:].eq(0).all(), (got, seqs)
            continue
        j = diff[0].item()
        assert j >= start, f"row {b}: the prompt differs at {j}"
        scores = ref.scores[j - start][b]
        lag = (scores.max() - scores[got[b, j]]).item()
        assert lag <= tie, (f"row {b}, generated token {j - start}: tpu chose {got[b, j].item()}, CPU "
                            f"{seqs[b, j].item()}, {lag:.2e} below it (not a near tie)\n{got}\n{seqs}")


# float4_e2m1fn_x2: two e2m1 values per byte, the low nibble first.
FLOAT4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def packed(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2)


def decoded(t, dim):
    """float4 pairs as float32 values, twice as many along `dim` (each byte's low nibble first)."""
    b = t.view(torch.uint8).long()
    codes = torch.stack([b & 15, b >> 4], dim=dim + 1)
    shape = list(t.shape)
    shape[dim] *= 2
    return FLOAT4_VALUES[codes.reshape(shape)]


def tiny_llama(dtype=torch.bfloat16):
    """A 2-layer Hugging Face Llama (width 64, vocabulary 128) with seeded weights, on CPU."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(dtype)
