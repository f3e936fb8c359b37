"""Bad inputs that TorchCTS's OpInfo error samples found accepted on tpu, or refused with another
message than CPU's: on tpu each raises CPU's exception class and message. Checks of values (CPU
reads them on the host) raise at the next synchronization, here the `.cpu()`."""
import pytest
import torch
import torch.nn.functional as F

from helpers import TPU


def long(*shape):
    return torch.zeros(shape, dtype=torch.long)


CASES = {
    "amax over a dim of 65": lambda d: torch.amax(torch.randn([1] * 65, device=d), dim=0),
    "amin over a dim of 65": lambda d: torch.amin(torch.randn([1] * 65, device=d), dim=(0, 1)),
    "aminmax over a dim of 65": lambda d: torch.aminmax(torch.randn([1] * 65, device=d), dim=0),
    "aminmax out of another dtype": lambda d: torch.aminmax(
        torch.randn(3, device=d), out=(torch.empty(0, dtype=torch.float64, device=d), torch.empty(0, device=d))),
    "renorm of a 0-d tensor": lambda d: torch.renorm(torch.tensor(1.0, device=d), 2.0, 0, 1.0),
    "renorm of a 1-d tensor": lambda d: torch.renorm(torch.ones(3, device=d), 2.0, 0, 1.0),
    "roll without shifts": lambda d: torch.roll(torch.ones(5, device=d), ()),
    "roll of a 0-d tensor along a dim": lambda d: torch.roll(torch.tensor(1.0, device=d), 1, 0),
    "narrow_copy past the dims": lambda d: torch.narrow_copy(torch.ones(10, 5, 20, device=d), 3, 0, 1),
    "narrow_copy of a negative length": lambda d: torch.narrow_copy(torch.ones(10, device=d), 0, 0, -1),
    "linalg.cross, its dim as given": lambda d: torch.linalg.cross(torch.ones(2, 3, device=d), torch.ones(2, 1, device=d), dim=-1),
    "adaptive_max_pool1d to a negative size": lambda d: F.adaptive_max_pool1d(torch.ones(1, 1, 4, device=d), -1),
    "adaptive_max_pool2d to a negative size": lambda d: F.adaptive_max_pool2d(torch.ones(1, 4, 4, device=d), (2, -1)),
    "adaptive_max_pool3d to a negative size": lambda d: F.adaptive_max_pool3d(torch.ones(1, 1, 4, 4, 4, device=d), (-1, 0, 2)),
    "adaptive_avg_pool2d to a negative size": lambda d: F.adaptive_avg_pool2d(torch.ones(1, 1, 4, 4, device=d), (-1, 0)),
    "avg_pool3d of a 3-d input": lambda d: F.avg_pool3d(torch.ones(0, 1, 49, device=d), 2),
    "max_pool3d of a 3-d input": lambda d: F.max_pool3d(torch.ones(2, 1, 49, device=d), 2),
    "multi_margin_loss, a 2-d target": lambda d: F.multi_margin_loss(torch.ones(5, 4, device=d), long(5, 4).to(d)),
    "multi_margin_loss, a [1, 5] target": lambda d: F.multi_margin_loss(torch.ones(5, 4, device=d), long(1, 5).to(d)),
    "multi_margin_loss, a 0-d target for a batch": lambda d: F.multi_margin_loss(torch.ones(5, 4, device=d), long().to(d)),
    "multinomial into a float64 out": lambda d: torch.multinomial(
        torch.ones(1, 2, dtype=torch.float64, device=d), 1, out=torch.empty(1, 1, dtype=torch.float64, device=d)),
    "gather out of another dtype": lambda d: torch.gather(
        torch.ones(2, 2, device=d), 1, long(2, 2).to(d), out=torch.empty(2, 2, dtype=torch.float64, device=d)),
    "masked_fill of long with a complex value tensor": lambda d: torch.ones(2, dtype=torch.long, device=d).masked_fill(
        torch.tensor(True, device=d), torch.tensor(1j, device=d)).cpu(),
    "masked_fill of float with a complex value tensor": lambda d: torch.ones(2, 2, device=d).masked_fill(
        torch.tensor([True, False], device=d), torch.tensor(2 - 1j, device=d)).cpu(),
}

INF, NAN = float("inf"), float("nan")
# multinomial's probabilities: sampling by keys (without replacement), then by the cumulative
# sum (with), where the first bad entry in row order names the error.
for rows in ([[1.0, -1.0, 1.0]], [[1.0, INF, 1.0]], [[1.0, -INF, 1.0]], [[1.0, 1.0, NAN]], [[0.0, 0.0, 0.0]],
             [[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, -1.0]], [[0.0, 0.0], [INF, 1.0]], [[1.0, INF], [1.0, -1.0]]):
    for replacement in (False, True):
        CASES[f"multinomial of {rows}, replacement={replacement}"] = (
            lambda d, rows=rows, r=replacement: torch.multinomial(torch.tensor(rows, device=d), 2, replacement=r).cpu())


@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_cpus_error(name):
    call = CASES[name]
    with pytest.raises(Exception) as cpu:
        call("cpu")
    with pytest.raises(type(cpu.value)) as tpu:
        call(TPU)
    # A check of values raised at the synchronization adds which op it came from.
    message = str(tpu.value).split("\n(from an earlier op")[0]
    assert message == str(cpu.value)


def test_accepted_neighbours_of_those_inputs_match_cpu():
    # The checks above refuse only what CPU refuses.
    x = torch.randn([1] * 64)
    assert torch.equal(torch.amax(x.to(TPU), dim=0).cpu(), torch.amax(x, dim=0))
    assert torch.equal(torch.roll(torch.tensor(2.0, device=TPU), 1).cpu(), torch.tensor(2.0))
    t = torch.tensor(2)
    assert torch.allclose(F.multi_margin_loss(torch.arange(4.0, device=TPU), t.to(TPU)).cpu(), F.multi_margin_loss(torch.arange(4.0), t))
    y = torch.randn(3, 4)
    assert torch.allclose(torch.renorm(y.to(TPU), 2.0, 0, 1.0).cpu(), torch.renorm(y, 2.0, 0, 1.0), atol=1e-6)
    filled = torch.ones(2, dtype=torch.long, device=TPU).masked_fill(torch.tensor(True, device=TPU), torch.tensor(3 + 0j, device=TPU))
    assert filled.tolist() == [3, 3]
    for replacement in (False, True):
        drawn = torch.multinomial(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]], device=TPU), 1, replacement=replacement)
        assert drawn.tolist() == [[1], [2]]
