"""Random ops inside torch.compile graphs: every sampler PyTorch compiles draws from the tpu
device generator inside the program (no eager fallback), reproducibly under torch.manual_seed,
with fresh draws per call and the distribution eager mode gives; dropout trains compiled, and
activation checkpointing recomputes the forward's masks."""
import math

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint
from helpers import TPU

N = 40000


def compiled_draws(fn, *args):
    """fn compiled; the results of two calls under seed 3, one more call, and one under seed 4."""
    torch._dynamo.reset()
    f = torch.compile(fn, backend="tpu")
    torch.manual_seed(3)
    first = f(*args).cpu()
    again = f(*args).cpu()
    torch.manual_seed(3)
    same = f(*args).cpu()
    torch.manual_seed(4)
    other = f(*args).cpu()
    return first, again, same, other


def moments_close(x, mean, var, sigmas=5):
    x = x.double()
    n = x.numel()
    assert abs(x.mean().item() - mean) < sigmas * math.sqrt(var / n), (x.mean().item(), mean)
    assert abs(x.var().item() - var) < 0.05 * var + 1e-12, (x.var().item(), var)


SAMPLERS = {
    # name: (function of a tpu tensor, the dtype and shape of its result, mean, variance)
    "rand": (lambda t: torch.rand(N, device=TPU), torch.float32, 0.5, 1 / 12),
    "rand_like_f64": (lambda t: torch.rand_like(t, dtype=torch.float64), torch.float64, 0.5, 1 / 12),
    "randn": (lambda t: torch.randn(N, device=TPU), torch.float32, 0.0, 1.0),
    "randn_like_bf16": (lambda t: torch.randn_like(t.bfloat16()), torch.bfloat16, 0.0, 1.0),
    "randint_low": (lambda t: torch.randint(3, 10, (N,), device=TPU), torch.int64, 6.0, (49 - 1) / 12),
    "randint_like": (lambda t: torch.randint_like(t, 4), torch.float32, 1.5, (16 - 1) / 12),
    "bernoulli_tensor": (lambda t: torch.bernoulli(torch.full_like(t, 0.3)), torch.float32, 0.3, 0.21),
    "bernoulli_p": (lambda t: torch.bernoulli(t, 0.7), torch.float32, 0.7, 0.21),
    "uniform_": (lambda t: torch.empty_like(t).uniform_(-2, 2), torch.float32, 0.0, 16 / 12),
    "normal_": (lambda t: torch.empty_like(t).normal_(3.0, 2.0), torch.float32, 3.0, 4.0),
    "exponential_": (lambda t: torch.empty_like(t).exponential_(2.0), torch.float32, 0.5, 0.25),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_in_a_compiled_graph(name, caplog):
    fn, dtype, mean, var = SAMPLERS[name]
    t = torch.zeros(N, device=TPU)
    first, again, same, other = compiled_draws(lambda t: fn(t) * 1, t)
    assert "runs eagerly" not in caplog.text, caplog.text
    assert first.dtype == dtype and first.shape == (N,)
    assert torch.equal(first, same), "same seed, same draws"
    assert not torch.equal(first, again) and not torch.equal(first, other), "each call draws anew"
    moments_close(first, mean, var)
    if name.startswith("randint"):
        lo, hi = (3, 10) if name == "randint_low" else (0, 4)
        assert first.min().item() == lo and first.max().item() == hi - 1
        assert (first == first.round()).all()


def test_the_generator_advances_like_eager():
    # A compiled call takes one step of the device generator: an eager draw after it differs
    # from one without it, and the generator's offset moved.
    f = torch.compile(lambda t: t + torch.rand_like(t), backend="tpu")
    t = torch.zeros(16, device=TPU)
    torch.manual_seed(0)
    f(t)
    after_compiled = torch.rand(16, device=TPU).cpu()
    torch.manual_seed(0)
    fresh = torch.rand(16, device=TPU).cpu()
    assert not torch.equal(after_compiled, fresh)
    torch.manual_seed(0)
    offset = torch.tpu.get_rng_state()
    f(t)
    assert not torch.equal(torch.tpu.get_rng_state(), offset)


def test_an_explicit_generator_draws_what_eager_mode_draws():
    # Dynamo breaks the graph at a random op given a torch.Generator (on every device): the op
    # runs eagerly from that generator, between the compiled pieces, and advances it.
    torch._dynamo.reset()
    g = torch.Generator(device=TPU)
    f = torch.compile(lambda t: (t * 2 + torch.randn(t.shape, device=t.device, generator=g)).sin(), backend="tpu")
    t = torch.linspace(-1, 1, 64, device=TPU)
    g.manual_seed(5)
    got = [f(t).cpu() for _ in range(2)]
    g.manual_seed(5)
    want = [(t * 2 + torch.randn(t.shape, device=TPU, generator=g)).sin().cpu() for _ in range(2)]
    torch.testing.assert_close(got, want)
    assert not torch.equal(got[0], got[1])


def test_two_samplers_in_one_graph_are_independent():
    f = torch.compile(lambda t: torch.stack([torch.rand_like(t), torch.rand_like(t), torch.randn_like(t)]), backend="tpu")
    a, b, z = f(torch.zeros(N, device=TPU)).cpu()
    assert not torch.equal(a, b)
    corr = torch.corrcoef(torch.stack([a, b, z]))
    assert corr.sub(torch.eye(3)).abs().max().item() < 0.03, corr


def test_randperm_and_multinomial_compiled():
    perm = torch.compile(lambda: torch.randperm(1000, device=TPU), backend="tpu")()
    assert torch.equal(perm.cpu().sort().values, torch.arange(1000))
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3], device=TPU)
    torch.manual_seed(1)
    draws = torch.compile(lambda p: torch.multinomial(p.expand(N // 4, 4), 1), backend="tpu")(probs).cpu()
    counts = torch.bincount(draws.flatten(), minlength=4).double() / draws.numel()
    assert counts[1] == 0
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.02, rtol=0)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_keep_rate_and_scale(p, caplog):
    x = torch.ones(N, device=TPU, requires_grad=True)
    f = torch.compile(lambda x: F.dropout(x, p, training=True), backend="tpu")
    y = f(x)
    y.sum().backward()
    assert "runs eagerly" not in caplog.text, caplog.text
    y, g = y.detach().cpu(), x.grad.cpu()
    kept = y != 0
    if p == 1.0:
        assert not kept.any() and (g == 0).all()
        return
    scale = 1 / (1 - p)
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], scale))
    # The gradient goes through the same mask.
    assert torch.equal(g != 0, kept)
    rate = kept.double().mean().item()
    assert abs(rate - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / N) + 1e-12, rate


def test_dropout_in_eval_mode_is_identity():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to(TPU).eval()
    x = torch.randn(4, 8, device=TPU)
    torch.testing.assert_close(torch.compile(model, backend="tpu")(x).cpu(), model(x).cpu())


def test_checkpoint_recomputes_the_forward_masks(caplog):
    # y = dropout(sin x) * w: w's gradient is dropout(sin x) and x's is mask * scale * w * cos x,
    # so both agree with y only if the backward recomputes the forward's mask.
    w = torch.randn(4096, device=TPU, requires_grad=True)
    x = torch.randn(4096, device=TPU, requires_grad=True)

    def block(x):
        return F.dropout(x.sin(), 0.5, training=True) * w

    y = torch.compile(lambda x: checkpoint.checkpoint(block, x, use_reentrant=False), backend="tpu")(x)
    y.sum().backward()
    assert "runs eagerly" not in caplog.text, caplog.text
    y = y.detach().cpu()
    assert 0.45 < (y != 0).float().mean().item() < 0.55
    torch.testing.assert_close(w.grad.cpu() * w.detach().cpu(), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.cpu() * x.detach().cpu().tan(), y, atol=1e-4, rtol=1e-4)


def test_checkpointed_block_gradients_equal_uncheckpointed():
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).to(TPU)
    x = torch.randn(8, 16, device=TPU, requires_grad=True)
    grads = []
    for ck in (False, True):
        torch._dynamo.reset()
        block.zero_grad()
        x.grad = None
        f = (lambda t: checkpoint.checkpoint(block, t, use_reentrant=False)) if ck else block
        torch.compile(f, backend="tpu")(x).square().sum().backward()
        grads.append([x.grad.cpu()] + [p.grad.cpu() for p in block.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


transformers = pytest.importorskip("transformers")

# Tiny configs: (model class, config class, config keys, input builder).
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            n_embd=32, n_layer=2, n_head=2, n_positions=32, d_model=32, d_ff=64, d_kv=16, num_layers=2,
            num_decoder_layers=2, num_heads=2, max_position_embeddings=32)
DROPOUT_KEYS = ["hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                "dropout_rate"]


def tiny_model(name, p):
    cfg = getattr(transformers, name + "Config")()
    for k, v in TINY.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)
    for k in DROPOUT_KEYS:
        if hasattr(cfg, k):
            setattr(cfg, k, p)
    cfg.attn_implementation = "eager"
    if name == "T5":
        cfg.decoder_start_token_id, cfg.pad_token_id = 0, 0
    torch.manual_seed(0)
    cls = {"Bert": transformers.BertForMaskedLM, "GPT2": transformers.GPT2LMHeadModel,
           "T5": transformers.T5ForConditionalGeneration}[name]
    return cls(cfg).to(TPU).train()


def loss_of(model, name, ids):
    if name == "T5":
        return model(input_ids=ids, labels=ids.flip(1)).loss
    return model(input_ids=ids, labels=ids).loss


def train_losses(model, name, step_fn, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1)).to(TPU)
    losses = []
    for _ in range(steps):
        loss = step_fn(model, name, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["Bert", "GPT2", "T5"])
def test_compiled_training_with_dropout(name, caplog):
    compiled = torch.compile(loss_of, backend="tpu")
    torch._dynamo.reset()
    # With dropout on: runs compiled (no graph falls back to eager), reproducible with a seed.
    runs = []
    for _ in range(2):
        model = tiny_model(name, 0.2)
        torch.manual_seed(5)
        runs.append(train_losses(model, name, compiled))
    assert "runs eagerly" not in caplog.text, caplog.text
    assert runs[0] == runs[1]
    assert all(math.isfinite(v) for v in runs[0])
    # Dropout changes the loss: with p = 0 the first loss differs from p = 0.2's.
    # With dropout p = 0 the compiled losses are eager's.
    torch._dynamo.reset()
    eager = train_losses(tiny_model(name, 0.0), name, loss_of)
    torch._dynamo.reset()
    comp = train_losses(tiny_model(name, 0.0), name, compiled)
    assert comp[0] != runs[0][0]
    torch.testing.assert_close(torch.tensor(comp), torch.tensor(eager), atol=1e-5, rtol=1e-5)
